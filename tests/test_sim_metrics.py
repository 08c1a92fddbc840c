"""Every flavor's /metrics parses with prometheus_client's text parser, carries that engine's real
names, and agrees with the simulator's ground truth while a request is running; llama.cpp's /slots
has the shape of a real capture."""

from __future__ import annotations

import json

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.waiting import patient

from collector.serving import serve_in_thread
from collector.sim.app import create_sim_app
from collector.sim.config import SimConfig

EXPECTED = {
    "vllm": {
        "vllm:num_requests_running": "running",
        "vllm:num_requests_waiting": "waiting",
        "vllm:kv_cache_usage_perc": "kv_usage_ratio",
        "vllm:prompt_tokens_total": "prompt_tokens_total",
        "vllm:generation_tokens_total": "generation_tokens_total",
        "vllm:prefix_cache_queries_total": "prompt_tokens_total",
    },
    "sglang": {
        "sglang:num_running_reqs": "running",
        "sglang:num_queue_reqs": "waiting",
        "sglang:token_usage": "kv_usage_ratio",
        "sglang:max_total_num_tokens": "kv_capacity_tokens",
    },
    "llamacpp": {
        "llamacpp:requests_processing": "running",
        "llamacpp:requests_deferred": "waiting",
        "llamacpp:prompt_tokens_total": "prompt_tokens_total",
        "llamacpp:tokens_predicted_total": "generation_tokens_total",
    },
}
HOLD = {
    "model": "m",
    "messages": [{"role": "user", "content": "y" * 400}],
    "stream": True,
    "max_tokens": 5000,
    "ignore_eos": True,
}


def _samples(text: str) -> dict[str, list]:
    found: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


def _scrape_while_running(config: SimConfig) -> tuple[dict, dict, list]:
    """Hold one slot busy, then scrape /metrics, /sim/state and /slots in a quiet moment."""
    handle = serve_in_thread(create_sim_app(config))
    try:
        with (
            httpx.Client(timeout=patient(30)) as client,
            client.stream("POST", f"{handle.url}/v1/chat/completions", json=HOLD) as held,
        ):
            lines = held.iter_lines()
            while "content" not in next(lines):  # wait until it is decoding
                pass
            metrics = client.get(f"{handle.url}/metrics")
            state = client.get(f"{handle.url}/sim/state").json()
            slots = client.get(f"{handle.url}/slots").json()
        assert metrics.headers["content-type"].startswith("text/plain")
        return _samples(metrics.text), state, slots
    finally:
        handle.stop()


@pytest.mark.parametrize("flavor", sorted(EXPECTED))
def test_flavor_metrics_use_real_names_and_match_ground_truth(flavor):
    samples, state, _ = _scrape_while_running(SimConfig(flavor=flavor, speed=0.5, max_num_seqs=4))
    assert state["running"] == 1 and state["kv_used_blocks"] > 0
    for name, key in EXPECTED[flavor].items():
        assert name in samples, f"{flavor} is missing {name}"
        value = samples[name][0].value
        if key in ("running", "waiting", "kv_capacity_tokens"):
            assert value == state[key], name
        else:  # counters and usage move while we scrape; same order of magnitude, non-zero
            assert value > 0, name
    other_prefixes = {f"{other}:" for other in EXPECTED if other != flavor}
    assert not [n for n in samples if any(n.startswith(p) for p in other_prefixes)]


def test_vllm_labels_cache_config_and_legacy_kv_name():
    samples, state, _ = _scrape_while_running(
        SimConfig(flavor="vllm", speed=0.5, kv_cache_tokens=8192, block_size=32)
    )
    running = samples["vllm:num_requests_running"][0]
    assert running.labels["model_name"] == "headroom-sim"
    info = samples["vllm:cache_config_info"][0].labels
    assert (int(info["num_gpu_blocks"]), int(info["block_size"])) == (256, 32)
    assert samples["vllm:num_preemptions_total"][0].value == state["preemptions_total"] == 0
    assert samples["vllm:prefix_cache_hits_total"][0].value == 0  # the simulator caches no prefixes
    legacy, _, _ = _scrape_while_running(SimConfig(flavor="vllm", speed=0.5, vllm_legacy_kv_metric=True))
    assert "vllm:gpu_cache_usage_perc" in legacy and "vllm:kv_cache_usage_perc" not in legacy
    assert 0 < legacy["vllm:gpu_cache_usage_perc"][0].value <= 1


def test_llamacpp_names_exist_in_a_real_capture_and_slots_match_its_shape(fixtures_dir):
    samples, state, slots = _scrape_while_running(
        SimConfig(flavor="llamacpp", speed=0.5, max_num_seqs=4, kv_cache_tokens=8192)
    )
    real = _samples((fixtures_dir / "llamacpp" / "metrics_busy.txt").read_text())
    assert set(EXPECTED["llamacpp"]) <= set(real) and set(EXPECTED["llamacpp"]) <= set(samples)
    captured = json.loads((fixtures_dir / "llamacpp" / "slots_busy.json").read_text())
    assert len(slots) == 4 and all(s["n_ctx"] == 2048 for s in slots)
    busy = [s for s in slots if s["is_processing"]]
    assert len(busy) == state["running"] == 1
    assert set(busy[0]) <= set(captured[0])  # same field names as the capture
    assert set(busy[0]["next_token"][0]) == set(captured[0]["next_token"][0])
    assert busy[0]["n_prompt_tokens"] == 103 and busy[0]["next_token"][0]["n_decoded"] >= 1
