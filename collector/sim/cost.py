"""The documented step-time model and the knee it predicts (docs/simulator.md explains both).

A step of a continuous-batching engine runs one forward pass over every scheduled token: one
decode token for each running request plus prefill chunks. Its time follows the roofline model of
"Transformer Inference Arithmetic" (kipp.ly, 2022) and "LLM Inference Unveiled: Survey and
Roofline Model Insights" (Yuan et al., 2024, arXiv:2402.16363): a pass costs the larger of its
memory time (read all weights once, plus the KV cache of every sequence in the batch) and its
compute time (2 FLOPs per parameter per token, plus attention that is quadratic in the prefill
length), plus a fixed per-step scheduling overhead. Decode is memory-bound, so small batches
amortise the weight read and tokens/s rises almost linearly with the batch until the scheduler's
max_num_seqs (or the KV cache) stops the batch from growing: that is the knee.

Two profiles (`headroom sim --cost-profile`):

  gpu  (default) an 8B-parameter fp16 model (Llama-3-8B shape) on one A100-80GB-class GPU. Memory
       and compute overlap (a pass costs the larger), so decode is memory-bound: batching is
       nearly free, TTFT stays flat until the batch is full (the memory-bound regime).
  cpu  a Gemma-3-270M-class model, 4-bit weights, on two CPU cores. Memory and compute do not
       overlap (a pass costs their sum), and the output head (262k vocabulary x 640) is computed
       for every sampled token, so step time grows with the tokens in the batch from the first
       request on: TTFT and TPOT grow with the batch before anything waits (the compute-bound
       regime of llama.cpp on a CPU, or long prompts on a GPU). One request decodes ~54 tok/s,
       four ~89, eight ~99, as measured on llama-server with 2 threads (~55 at one request).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["CostModel", "COST_PROFILES", "PredictedRate", "blocks_for", "predicted_knee", "predicted_rate"]


@dataclass(frozen=True)
class CostModel:
    """Roofline coefficients; all times in simulated seconds."""

    params: float = 8.0e9  # model parameters
    bytes_per_param: float = 2.0  # fp16 weights
    layers: int = 32
    hidden_size: int = 4096
    kv_bytes_per_token: float = 131072  # 2 (K,V) x 32 layers x 8 kv heads x 128 dims x 2 bytes
    memory_bandwidth: float = 1.5e12  # bytes/s actually achieved (~75 % of 2 TB/s)
    compute_flops: float = 2.0e14  # FLOP/s actually achieved (~60 % of 312 TFLOPS)
    step_overhead_s: float = 0.002  # scheduler, sampling and kernel launches per step
    head_params: float = 0.0  # output-head parameters, computed for sampled tokens only
    overlap: bool = True  # memory and compute overlap (GPU) or add up (CPU)

    def step_seconds(
        self, decode_seqs: int, kv_tokens_read: int, prefill_chunks: tuple[tuple[int, int], ...] = ()
    ) -> float:
        """Time of one step.

        decode_seqs: requests emitting one token; kv_tokens_read: KV tokens attended over by the
        batch; prefill_chunks: (chunk_tokens, tokens already in context) per prefilling request.
        Example (defaults): 8 decode seqs over 8 x 200 KV tokens -> ~0.0129 s.
        """
        if decode_seqs == 0 and not prefill_chunks:
            return 0.0
        tokens = decode_seqs + sum(chunk for chunk, _ in prefill_chunks)
        sampled = decode_seqs + len(prefill_chunks)  # logits only at each sequence's last position
        weight_bytes = (self.params + self.head_params) * self.bytes_per_param
        memory_s = (weight_bytes + self.kv_bytes_per_token * kv_tokens_read) / self.memory_bandwidth
        linear_flops = 2.0 * self.params * tokens + 2.0 * self.head_params * sampled
        # attention scores + weighted sum: 4 * layers * hidden per (query token, key token) pair
        attention_flops = (
            4.0
            * self.layers
            * self.hidden_size
            * sum(chunk * (context + chunk / 2.0) for chunk, context in prefill_chunks)
        )
        compute_s = (linear_flops + attention_flops) / self.compute_flops
        busy_s = max(memory_s, compute_s) if self.overlap else memory_s + compute_s
        return busy_s + self.step_overhead_s

    def decode_tokens_per_second(self, batch: int, context_tokens: int) -> float:
        """Steady decode throughput of `batch` sequences of `context_tokens` each (no prefill)."""
        return batch / self.step_seconds(batch, batch * context_tokens)


COST_PROFILES: dict[str, CostModel] = {
    "gpu": CostModel(),
    # Gemma-3-270M: 100M body + 168M tied output head, Q4_K_M (~4.5 bits), 2 CPU cores
    "cpu": CostModel(
        params=1.0e8,
        head_params=1.68e8,
        bytes_per_param=0.56,
        layers=18,
        hidden_size=640,
        kv_bytes_per_token=18432,
        memory_bandwidth=2.0e10,
        compute_flops=6.0e10,
        step_overhead_s=0.002,
        overlap=False,
    ),
}


def blocks_for(tokens: int, block_size: int) -> int:
    """KV blocks holding `tokens` tokens. Example: blocks_for(1000, 16) -> 63."""
    return math.ceil(tokens / block_size) if tokens > 0 else 0


def predicted_knee(
    max_num_seqs: int, kv_cache_tokens: int, block_size: int, prompt_tokens: int, output_tokens: int
) -> int:
    """Largest batch the engine can run for fixed-length requests: the throughput knee.

    min(max_num_seqs, floor(num_blocks / blocks per request at full length)); the KV term is the
    memory ceiling of docs/domain.md §4 in blocks. Example: (8, 4400, 16, 1000, 64) -> 4.
    """
    num_blocks = kv_cache_tokens // block_size
    per_request = blocks_for(prompt_tokens + output_tokens, block_size)
    return max(1, min(max_num_seqs, num_blocks // per_request))


@dataclass(frozen=True)
class PredictedRate:
    """The most requests/s (and prompt tokens/s) the engine serves: its open-loop capacity μ."""

    requests_per_s: float
    prefill_tokens_per_s: float
    batch: int  # requests running at once at that rate (the knee)
    cycle_s: float  # simulated seconds of one cycle of `output_tokens` steps at a full batch


def predicted_rate(
    cost: CostModel,
    *,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    kv_cache_tokens: int,
    block_size: int,
    prompt_tokens: int,
    output_tokens: int,
    speed: float = 1.0,
) -> PredictedRate:
    """The saturation rate μ of fixed-length requests (prompt p, output o, ignore_eos): docs/simulator.md.

    Past μ the queue never empties, so every slot of the full batch (B = predicted_knee) takes
    the next waiting request the step after its last token: a slot cycles every o steps (one
    prefill step that samples the first token, o - 1 decode steps). With the slots' phases spread
    evenly over the cycle, each of the o steps holds the prefills of the slots starting in it and
    one decode token of every other slot (context p + age), so

        μ = B / Σ_j step_seconds(step j of the cycle) × speed,   V_P = μ × p.

    Exact in the cpu profile (step time is linear in the tokens, so how prefills group does not
    matter) and in the gpu profile while a step stays memory-bound (short prompts). ValueError
    when the KV cache binds before max_num_seqs (preemption, not modelled here) or a step's
    tokens exceed max_num_batched_tokens (chunked prefill, not modelled here).
    Example (gpu, 8 seqs, 2048 budget, 65536 KV, 16, p 40, o 64) -> ~9.83 requests/s (cpu: ~1.28).
    """
    if prompt_tokens < 1 or output_tokens < 1 or not speed > 0:
        raise ValueError(
            f"prompt_tokens={prompt_tokens}, output_tokens={output_tokens}, speed={speed}: "
            "all must be positive"
        )
    batch = predicted_knee(max_num_seqs, kv_cache_tokens, block_size, prompt_tokens, output_tokens)
    if batch < max_num_seqs:
        raise ValueError(
            f"the KV cache binds at {batch} requests before max_num_seqs={max_num_seqs}: the rate model "
            "covers slot-bound configurations only (raise kv_cache_tokens)"
        )
    phases = [i * output_tokens // batch for i in range(batch)]
    cycle_s = 0.0
    for step in range(output_tokens):
        decode, kv_read, chunks = 0, 0, []
        for phase in phases:
            age = (step - phase) % output_tokens
            if age == 0:
                chunks.append((prompt_tokens, 0))
                kv_read += prompt_tokens
            else:
                decode += 1
                kv_read += prompt_tokens + age
        if decode + prompt_tokens * len(chunks) > max_num_batched_tokens:
            raise ValueError(
                f"a step schedules {decode + prompt_tokens * len(chunks)} tokens, more than "
                f"max_num_batched_tokens={max_num_batched_tokens}: chunked prefill is not modelled"
            )
        cycle_s += cost.step_seconds(decode, kv_read, tuple(chunks))
    rate = batch / cycle_s * speed
    return PredictedRate(rate, rate * prompt_tokens, batch, cycle_s)
