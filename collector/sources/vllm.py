"""vLLM: normalise `vllm:*` metrics (V0 and V1 engines, old and new KV-cache names).

vLLM renamed its KV metric (`vllm:gpu_cache_usage_perc` -> `vllm:kv_cache_usage_perc`, 0.9 to
0.11) and broke public dashboards; both names are accepted, the new one first. Both are 0-1
despite the `_perc` suffix. KV capacity in tokens is `num_gpu_blocks * block_size` from the labels
of `vllm:cache_config_info`. With data parallelism vLLM exports one label set per `engine`:
counts are summed, KV usage takes the fullest engine (it preempts first). Newer vLLM also puts
`kv_cache_max_concurrency` (the requests that fit at max_model_len) on cache_config_info: the
engine's own ceiling. With LoRA enabled, `vllm:lora_requests_info{max_lora, running_lora_adapters,
waiting_lora_adapters}` says the adapter slots (`--max-loras`); its value is the time it was set
and each set of labels stays exported, so the newest one is current. The engine's own saturation
symptoms are relayed as counters, summed over engines: preemptions (`vllm:num_preemptions_total`)
and the prefix cache's queried and hit tokens (`vllm:prefix_cache_queries_total`, `_hits_total`,
vLLM 0.7 and later; absent before).
"""

from __future__ import annotations

from dataclasses import replace

from collector.sources.base import (
    EngineSnapshot,
    FieldRule,
    Samples,
    names_of,
    parse_exposition,
    snapshot_from_rules,
)
from collector.sources.renames import names

__all__ = ["ENGINE", "RULES", "parse_vllm", "kv_capacity_tokens", "max_concurrency", "adapter_slots"]

ENGINE = "vllm"
RULES = {
    "running": FieldRule(("vllm:num_requests_running",)),
    "waiting": FieldRule(("vllm:num_requests_waiting",)),
    "kv_usage": FieldRule(names("vllm:kv_cache_usage_perc"), aggregate="max"),  # and its older name
}
# The saturation counters relayed (summed over data-parallel engines)
PREEMPTIONS = FieldRule(("vllm:num_preemptions_total",))
PREFIX_QUERIES = FieldRule(("vllm:prefix_cache_queries_total",))
PREFIX_HITS = FieldRule(("vllm:prefix_cache_hits_total",))
NAMES = names_of(
    RULES,
    *PREEMPTIONS.names,
    *PREFIX_QUERIES.names,
    *PREFIX_HITS.names,
    "vllm:cache_config_info",
    "vllm:lora_requests_info",
)


def kv_capacity_tokens(samples: Samples) -> int | None:
    """Σ num_gpu_blocks × block_size over `vllm:cache_config_info` label sets, else None.

    {"num_gpu_blocks": "2048", "block_size": "16"} -> 32768
    """
    total = 0
    for labels, _ in samples.get("vllm:cache_config_info", ()):
        try:
            total += int(labels["num_gpu_blocks"]) * int(labels["block_size"])
        except (KeyError, ValueError):  # "None" before the profiler ran
            continue
    return total or None


def max_concurrency(samples: Samples) -> int | None:
    """`kv_cache_max_concurrency` from `vllm:cache_config_info` (newer vLLM), floored; else None.

    vLLM computes it at max_model_len, so it is a worst case: shorter requests fit more. The
    metric has no model_name label (never join on it). {"kv_cache_max_concurrency": "46.3"} -> 46
    """
    found = []
    for labels, _ in samples.get("vllm:cache_config_info", ()):
        try:
            found.append(int(float(labels["kv_cache_max_concurrency"])))
        except (KeyError, ValueError):
            continue
    return sum(found) if found else None


def adapter_slots(samples: Samples) -> int | None:
    """`max_lora` of the newest `vllm:lora_requests_info` label set (its value is when it was set);
    None without LoRA. {"max_lora": "4", ...} 1767225600.0 -> 4
    """
    newest: tuple[float, int] | None = None
    for labels, stamp in samples.get("vllm:lora_requests_info", ()):
        try:
            slots = int(labels["max_lora"])
        except (KeyError, ValueError):
            continue
        if slots >= 0 and (newest is None or stamp >= newest[0]):
            newest = (stamp, slots)
    return None if newest is None else newest[1]


def parse_vllm(text: str) -> EngineSnapshot:
    """Parse a vLLM /metrics page into an EngineSnapshot."""
    samples = parse_exposition(text, NAMES)
    snapshot = snapshot_from_rules(ENGINE, samples, model_label="model_name", **RULES)
    return replace(
        snapshot,
        kv_capacity_tokens=kv_capacity_tokens(samples),
        max_concurrency=max_concurrency(samples),
        adapter_slots=adapter_slots(samples),
        preemptions_total=PREEMPTIONS.apply(samples),
        prefix_cache_queries_total=PREFIX_QUERIES.apply(samples),
        prefix_cache_hits_total=PREFIX_HITS.apply(samples),
    )
