"""The simulator's LoRA adapters: at most max_loras distinct adapters in the running batch, an LRU
of GPU slots whose every load costs lora_load_s, /v1/models with each adapter's parent, and the
engines' adapter series (vLLM's lora_requests_info, SGLang's lora_pool_slots_*).

The ground truth of the thrash (docs/simulator.md, "LoRA adapters"): with no more adapters in the
mix than slots each adapter is loaded once and every request is timed exactly as without adapters;
with more, the batch is cut to the slots' adapters, loads repeat, and TTFT rises.
"""

from __future__ import annotations

import statistics

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.offline import Mix, closed_loop_rows

from collector.serving import serve_in_thread
from collector.sim.app import create_sim_app
from collector.sim.config import SimConfig
from collector.sim.scheduler import Scheduler, SimRequest

NAMES = tuple(f"lora-{i}" for i in range(8))
SLOTS = 4


def _config(**overrides: object) -> SimConfig:
    options: dict[str, object] = {
        "max_num_seqs": 16,
        "lora_adapters": NAMES,
        "max_loras": SLOTS,
        "lora_load_s": 0.05,
    }
    return SimConfig(**(options | overrides))  # type: ignore[arg-type]


def _ttfts(adapters: int, load_s: float = 0.05) -> list[float]:
    config = _config(lora_load_s=load_s)
    rows = closed_loop_rows(config, [16], 30.0, Mix(output_tokens=64, adapters=NAMES[:adapters]))
    return [row["ttft_s"] for row in rows if row["ttft_s"] is not None]


def test_adapters_within_the_slots_cost_nothing_but_one_load_each():
    base = _ttfts(0)
    for adapters in (2, SLOTS):
        ttfts = _ttfts(adapters)
        # the first step loads each adapter once (the first batch's TTFT); after that, no load
        assert ttfts[:16] == pytest.approx([t + adapters * 0.05 for t in base[:16]], abs=1e-9)
        assert ttfts[16:] == pytest.approx(base[16:], abs=1e-9) and len(ttfts) == len(base)


def test_more_adapters_than_slots_thrash_and_ttft_rises():
    base, thrash = statistics.median(_ttfts(2)), statistics.median(_ttfts(8))
    assert thrash > 3 * base, (base, thrash)  # the model gives 0.053 s -> 0.24 s


def test_the_batch_never_holds_more_adapters_than_slots_and_every_load_is_charged():
    config = _config(lora_load_s=1.0)  # a load dwarfs a step: easy to see in the duration
    scheduler = Scheduler(config)
    for i in range(32):
        scheduler.add(SimRequest(f"r{i}", 20, 8, adapter=NAMES[i % 8]))
    loads = 0
    while scheduler.has_work:
        plan = scheduler.plan_step()
        assert len(scheduler.running_adapters()) <= SLOTS
        assert len(scheduler.loaded_adapters) <= SLOTS
        assert (plan.duration_s >= 1.0) == (plan.adapter_loads > 0)
        loads += plan.adapter_loads
    assert loads == scheduler.adapter_loads_total >= 8 and scheduler.generation_tokens_total == 32 * 8


def test_a_skipped_request_keeps_its_place_and_base_requests_pass_it():
    scheduler = Scheduler(_config(max_loras=1))
    first, other, base = (
        SimRequest("a", 20, 4, adapter="lora-0"),
        SimRequest("b", 20, 4, adapter="lora-1"),
        SimRequest("c", 20, 4),
    )
    for request in (first, other, base):
        scheduler.add(request)
    scheduler.plan_step()
    assert scheduler.running == [first, base] and list(scheduler.waiting) == [other]


def test_config_refuses_an_adapter_named_like_the_model():
    with pytest.raises(ValueError, match="repeat"):
        SimConfig(lora_adapters=("headroom-sim",))
    with pytest.raises(ValueError, match="max_loras"):
        SimConfig(max_loras=0)


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_models_list_parents_and_metrics_show_the_slots(flavor: str):
    config = _config(flavor=flavor, model="base", lora_adapters=("sql", "chat"), max_loras=2)
    handle = serve_in_thread(create_sim_app(config))
    try:
        models = httpx.get(f"{handle.url}/v1/models").json()["data"]
        text = httpx.get(f"{handle.url}/metrics").text
    finally:
        handle.stop()
    assert [(m["id"], m["parent"]) for m in models] == [("base", None), ("sql", "base"), ("chat", "base")]
    samples = {s.name: s for f in text_string_to_metric_families(text) for s in f.samples}
    if flavor == "vllm":
        info = samples["vllm:lora_requests_info"]
        assert info.labels == {"max_lora": "2", "running_lora_adapters": "", "waiting_lora_adapters": ""}
    else:
        assert samples["sglang:lora_pool_slots_total"].value == 2
        assert samples["sglang:lora_pool_slots_used"].value == 0


def test_without_adapters_no_adapter_series():
    handle = serve_in_thread(create_sim_app(SimConfig()))
    try:
        text = httpx.get(f"{handle.url}/metrics").text
    finally:
        handle.stop()
    assert "lora" not in text
