"""The simulator's engine `/metrics`, in the real metric names of the chosen flavor.

One collector builds fresh families per scrape from Engine.state(), so an engine source under test
sees exactly what vLLM, SGLang or llama.cpp (`--metrics`) would expose (docs/domain.md §8):

  vllm      vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc
            (or the pre-0.10 vllm:gpu_cache_usage_perc), vllm:cache_config_info{num_gpu_blocks,
            block_size}, vllm:prompt_tokens_total, vllm:generation_tokens_total,
            vllm:num_preemptions_total, vllm:prefix_cache_queries_total (the prompt tokens) and
            vllm:prefix_cache_hits_total (0: the simulator caches no prefixes); labels model_name,
            engine; with LoRA adapters also
            vllm:lora_requests_info{max_lora, running_lora_adapters, waiting_lora_adapters} (the
            adapters comma-separated; the value is the time it was set, as vLLM does)
  sglang    sglang:num_running_reqs, sglang:num_queue_reqs, sglang:token_usage,
            sglang:max_total_num_tokens, sglang:prompt_tokens_total,
            sglang:generation_tokens_total; label model_name; with LoRA adapters also
            sglang:lora_pool_slots_used (distinct adapters of the running batch) and
            sglang:lora_pool_slots_total (max_loras_per_batch)
  llamacpp  llamacpp:requests_processing, llamacpp:requests_deferred,
            llamacpp:prompt_tokens_total, llamacpp:tokens_predicted_total; no labels
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from collector.sim.engine import EngineState

__all__ = ["EngineMetricsCollector", "FAULTS", "render_metrics"]

FAULTS = (None, "freeze", "drop_kv")  # EngineMetricsCollector.fault
_KV_USAGE = frozenset({"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"})


class EngineMetricsCollector:
    """prometheus-client custom collector over a zero-argument `state()` callable."""

    def __init__(
        self, state: Callable[[], EngineState], flavor: str, model: str, legacy_vllm_kv: bool = False
    ) -> None:
        self._state = state
        self._flavor = flavor
        self._model = model
        self._legacy_vllm_kv = legacy_vllm_kv
        # A fault of the engine's exporter, set while the simulator runs (app.state.metrics.fault):
        # "freeze" serves the page of the moment it was set, again and again (a wedged exporter);
        # "drop_kv" leaves the KV-usage family out (a rename the reader does not know). None: healthy.
        self.fault: str | None = None
        self._frozen: list[Metric] | None = None

    def collect(self) -> Iterator[Metric]:
        """Yield this flavor's families built from the current engine state (or the fault's)."""
        if self.fault not in FAULTS:
            raise ValueError(f"metrics fault {self.fault!r} is not one of {FAULTS}")
        if self.fault == "freeze":
            if self._frozen is None:
                self._frozen = list(self._families())
            yield from self._frozen
            return
        self._frozen = None
        for family in self._families():
            if self.fault == "drop_kv" and family.name in _KV_USAGE:
                continue
            yield family

    def _families(self) -> Iterator[Metric]:
        state = self._state()
        families = {"vllm": self._vllm, "sglang": self._sglang, "llamacpp": self._llamacpp}[self._flavor]
        yield from families(state)

    def _vllm(self, s: EngineState) -> Iterator[Metric]:
        labels, values = ["model_name", "engine"], [self._model, "0"]
        yield _gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            labels,
            values,
            s["running"],
        )
        yield _gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            labels,
            values,
            s["waiting"],
        )
        kv_name = "vllm:gpu_cache_usage_perc" if self._legacy_vllm_kv else "vllm:kv_cache_usage_perc"
        yield _gauge(
            kv_name, "KV-cache usage. 1 means 100 percent usage.", labels, values, s["kv_usage_ratio"]
        )
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=["block_size", "num_gpu_blocks", "engine"],
        )
        info.add_metric(
            [str(s["kv_capacity_tokens"] // s["kv_total_blocks"]), str(s["kv_total_blocks"]), "0"], 1.0
        )
        yield info
        yield _counter(
            "vllm:prompt_tokens",
            "Number of prefill tokens processed.",
            labels,
            values,
            s["prompt_tokens_total"],
        )
        yield _counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            labels,
            values,
            s["generation_tokens_total"],
        )
        yield _counter(
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            labels,
            values,
            s["preemptions_total"],
        )
        yield _counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            labels,
            values,
            s["prompt_tokens_total"],
        )
        yield _counter(  # no prefix caching here: every queried token misses
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            labels,
            values,
            0,
        )
        if s["lora_adapters"]:
            yield _gauge(
                "vllm:lora_requests_info",
                "Running stats on lora requests.",
                ["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
                [str(s["max_loras"]), ",".join(s["running_adapters"]), ",".join(s["waiting_adapters"])],
                time.time(),
            )

    def _sglang(self, s: EngineState) -> Iterator[Metric]:
        labels, values = ["model_name"], [self._model]
        yield _gauge(
            "sglang:num_running_reqs", "The number of running requests.", labels, values, s["running"]
        )
        yield _gauge(
            "sglang:num_queue_reqs",
            "The number of requests in the waiting queue.",
            labels,
            values,
            s["waiting"],
        )
        yield _gauge("sglang:token_usage", "The token usage.", labels, values, s["kv_usage_ratio"])
        yield _gauge(
            "sglang:max_total_num_tokens",
            "Maximum total number of tokens in the KV cache pool.",
            labels,
            values,
            s["kv_capacity_tokens"],
        )
        yield _counter(
            "sglang:prompt_tokens",
            "Number of prefill tokens processed.",
            labels,
            values,
            s["prompt_tokens_total"],
        )
        yield _counter(
            "sglang:generation_tokens",
            "Number of generation tokens processed.",
            labels,
            values,
            s["generation_tokens_total"],
        )
        if s["lora_adapters"]:
            used = len(s["running_adapters"])
            yield _gauge("sglang:lora_pool_slots_used", "LoRA slots in use.", labels, values, used)
            yield _gauge("sglang:lora_pool_slots_total", "Total LoRA slots.", labels, values, s["max_loras"])

    def _llamacpp(self, s: EngineState) -> Iterator[Metric]:
        yield _counter(
            "llamacpp:prompt_tokens", "Number of prompt tokens processed.", [], [], s["prompt_tokens_total"]
        )
        yield _counter(
            "llamacpp:tokens_predicted",
            "Number of generation tokens processed.",
            [],
            [],
            s["generation_tokens_total"],
        )
        yield _gauge("llamacpp:requests_processing", "Number of requests processing.", [], [], s["running"])
        yield _gauge("llamacpp:requests_deferred", "Number of requests deferred.", [], [], s["waiting"])


def _gauge(
    name: str, help_text: str, labels: list[str], values: list[str], value: float
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, help_text, labels=labels)
    family.add_metric(values, float(value))
    return family


def _counter(
    name: str, help_text: str, labels: list[str], values: list[str], value: float
) -> CounterMetricFamily:
    family = CounterMetricFamily(name, help_text, labels=labels)
    family.add_metric(values, float(value))
    return family


def render_metrics(collector: EngineMetricsCollector) -> bytes:
    """Text exposition (format 0.0.4) of one collector, as an engine's /metrics returns it."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry)
