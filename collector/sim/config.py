"""SimConfig: every knob of the simulator, validated once, with errors that name the bad value."""

from __future__ import annotations

from dataclasses import dataclass

from collector.sim.cost import COST_PROFILES, PredictedRate, predicted_rate

__all__ = ["SimConfig", "FLAVORS"]

FLAVORS = ("vllm", "sglang", "llamacpp")


@dataclass(frozen=True)
class SimConfig:
    """Simulator settings; names follow vLLM's flags where one exists (max_num_seqs, ...)."""

    flavor: str = "vllm"
    model: str = "headroom-sim"
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 2048
    kv_cache_tokens: int = 65536
    block_size: int = 16
    max_waiting: int = 256
    speed: float = 1.0
    seed: int = 0
    mean_output_tokens: int = 128
    max_model_len: int = 32768
    stream_interval: int = 1  # tokens per streamed chunk after the first (vLLM/SGLang --stream-interval)
    vllm_legacy_kv_metric: bool = False  # expose vllm:gpu_cache_usage_perc (vLLM < 0.10) instead
    # vLLM --enable-per-request-metrics: a `metrics` object on each answer (collector.sim.timings);
    # llama.cpp sends its `timings` always, SGLang nothing, so it is vLLM's alone
    per_request_metrics: bool = False
    cost_profile: str = "gpu"  # step-time model: gpu (memory-bound) or cpu (compute-bound)
    # LoRA adapters served beside the base model (vLLM --lora-modules), the GPU's adapter slots
    # (vLLM --max-loras, SGLang --max-loras-per-batch) and the simulated seconds to load one
    lora_adapters: tuple[str, ...] = ()
    max_loras: int = 4
    lora_load_s: float = 0.05

    def __post_init__(self) -> None:
        if self.flavor not in FLAVORS:
            raise ValueError(f"flavor {self.flavor!r} is not one of {', '.join(FLAVORS)}")
        for name in (
            "max_num_seqs",
            "max_num_batched_tokens",
            "kv_cache_tokens",
            "block_size",
            "mean_output_tokens",
            "max_model_len",
            "stream_interval",
            "max_loras",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")
        if self.per_request_metrics and self.flavor != "vllm":
            raise ValueError(
                f"per_request_metrics is vLLM's --enable-per-request-metrics, not {self.flavor}'s "
                "(llama.cpp always sends its timings, SGLang none): use flavor vllm or leave it off"
            )
        if self.cost_profile not in COST_PROFILES:
            raise ValueError(f"cost_profile {self.cost_profile!r} is not one of {', '.join(COST_PROFILES)}")
        if not self.lora_load_s >= 0:
            raise ValueError(f"lora_load_s={self.lora_load_s} must be 0 or more seconds")
        if self.model in self.lora_adapters or len(set(self.lora_adapters)) < len(self.lora_adapters):
            raise ValueError(f"lora_adapters {list(self.lora_adapters)} repeat a name or the model's")
        if self.max_waiting < 0:
            raise ValueError(f"max_waiting={self.max_waiting} must be 0 or more")
        if not self.speed > 0:
            raise ValueError(f"speed={self.speed} must be positive (2.0 = twice as fast as real time)")
        if self.kv_cache_tokens < self.block_size:
            raise ValueError(
                f"kv_cache_tokens={self.kv_cache_tokens} is smaller than one block "
                f"({self.block_size} tokens); raise --kv-cache-tokens"
            )

    def adapter_of(self, model: object) -> str | None:
        """The adapter a request's `model` names, or None for the base model (or any other name)."""
        return model if isinstance(model, str) and model in self.lora_adapters else None

    def predicted_rate(self, prompt_tokens: int, output_tokens: int) -> PredictedRate:
        """The analytic μ of fixed-length requests on this engine, per second of wall time at its
        speed (collector.sim.cost.predicted_rate, docs/simulator.md)."""
        return predicted_rate(
            COST_PROFILES[self.cost_profile],
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            kv_cache_tokens=self.kv_cache_tokens,
            block_size=self.block_size,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            speed=self.speed,
        )

    @property
    def num_blocks(self) -> int:
        """KV-cache blocks: whole blocks of block_size tokens that fit in kv_cache_tokens."""
        return self.kv_cache_tokens // self.block_size
