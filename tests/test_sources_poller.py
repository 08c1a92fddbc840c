"""The background engine poller and build_engine_source, against a small fake engine on loopback."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time

import httpx
import pytest
from conftest import require_tool
from prometheus_client import CollectorRegistry, generate_latest
from support.engine import FIXTURES
from support.waiting import patient

from collector.catalog import spec
from collector.sources import build_engine_source, default_metrics_url, models_url
from collector.sources.base import EngineSnapshot
from collector.sources.gpu import GpuCollector
from collector.sources.health import SourceHealth
from collector.sources.poller import EngineSource, ScrapeError
from collector.sources.scrapers import text_scraper
from collector.sources.served import served_model
from collector.sources.vllm import parse_vllm


def value(collector, name: str, **labels) -> float | None:
    """One sample of a source as the sidecar exports it: behind SourceHealth (scrape health too)."""
    registry = CollectorRegistry()
    registry.register(SourceHealth([collector]))
    return registry.get_sample_value(name, labels)


# What a poll of the fake engine may take where the test needs its answer: the engine (a thread
# of this process) must answer in time on a busy host too. Where a test needs a poll to time out,
# the engine hangs for longer than this (until the test lets it go).
ANSWER_S = patient(5)


async def wait_for(condition, timeout_s: float = 10.0):
    """Poll `condition()` until true or fail after timeout_s (stretched for a busy host)."""
    deadline = time.monotonic() + patient(timeout_s)
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def started(source: EngineSource) -> EngineSource:
    await source.start()
    return source


async def first_polled(source: EngineSource) -> EngineSnapshot:
    """Start `source` and wait for its background loop's first poll (the next is a minute away), so
    the test's own polls never overlap it."""
    await source.start()
    await wait_for(lambda: source.polls >= 1)
    return source.latest


async def test_poll_exports_normalised_gauges_with_engine_and_model_labels(fake_engine):
    engine, url = fake_engine
    source = await started(build_engine_source("vllm", f"{url}/metrics", 60, timeout_s=ANSWER_S))
    try:
        await wait_for(lambda: source.polls >= 1)
        labels = {"engine": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct"}
        assert value(source, "headroom_engine_up", engine="vllm") == 1.0
        assert value(source, "headroom_engine_requests_running", **labels) == 7
        assert value(source, "headroom_engine_requests_waiting", **labels) == 3
        kv = value(source, "headroom_engine_kv_cache_usage_ratio", **labels)
        assert kv == pytest.approx(0.6375)
        assert value(source, "headroom_engine_kv_cache_capacity_tokens", **labels) == 27403 * 16
        assert value(source, "headroom_source_scrape_success", source="engine") == 1.0
        assert value(source, "headroom_source_scrape_duration_seconds", source="engine") > 0
        assert (source.latest.waiting, source.latest.kv_usage_ratio) == (3, pytest.approx(0.6375))
    finally:
        await source.stop()


def test_vllm_saturation_counters_are_relayed_as_counters_and_absent_when_unknown():
    source = build_engine_source("vllm", "http://127.0.0.1:9/metrics", 1)
    source.latest = EngineSnapshot(
        engine="vllm",
        up=True,
        model="m",
        running=1,
        preemptions_total=17.0,
        prefix_cache_queries_total=182345.0,
        prefix_cache_hits_total=40112.0,
    )
    labels = {"engine": "vllm", "model": "m"}
    assert value(source, "headroom_engine_preemptions_total", **labels) == 17.0
    assert value(source, "headroom_engine_prefix_cache_queries_total", **labels) == 182345.0
    assert value(source, "headroom_engine_prefix_cache_hits_total", **labels) == 40112.0
    text = generate_latest(_registry(source)).decode()
    assert "# TYPE headroom_engine_preemptions_total counter" in text
    source.latest = EngineSnapshot(engine="vllm", up=True, model="m", running=1)  # vLLM < 0.7
    assert value(source, "headroom_engine_prefix_cache_hits_total", **labels) is None
    assert value(source, "headroom_engine_preemptions_total", **labels) is None


def test_help_text_says_values_are_as_of_the_last_poll():
    for name in (
        "headroom_engine_requests_running",
        "headroom_engine_requests_waiting",
        "headroom_engine_kv_cache_usage_ratio",
        "headroom_engine_kv_cache_capacity_tokens",
    ):
        assert "as of the last poll" in spec(name).help
    source = build_engine_source("vllm", "http://127.0.0.1:9/metrics", 1)
    source.latest = source.latest.__class__(engine="vllm", up=True, running=1)
    text = generate_latest(_registry(source)).decode()
    assert (
        "# HELP headroom_engine_requests_running Requests running in the engine's batch, "
        "as of the last poll." in text
    )


def _registry(*collectors) -> CollectorRegistry:
    registry = CollectorRegistry()
    for collector in collectors:
        registry.register(collector)
    return registry


@pytest.mark.parametrize(
    "mode, error",
    [
        ("hang", "no answer within"),
        ("garbage", "are on this page"),
        ("error", "HTTP 500"),
    ],
)
async def test_failing_engine_is_down_with_unknown_values_and_recovers(fake_engine, mode, error):
    engine, url = fake_engine
    # long enough for the page (and the garbage) to be read in time; the hang outlasts it
    timeout_s = patient(1.0)
    source = build_engine_source("vllm", f"{url}/metrics", 60, timeout_s=timeout_s)
    await source.start()
    try:
        await wait_for(lambda: source.latest.up)
        engine.mode = mode
        began = time.monotonic()
        snapshot = await source.poll_once()
        # bounded by timeout_s, even while hanging
        assert time.monotonic() - began < timeout_s + patient(1.0)
        assert not snapshot.up and error in snapshot.error
        assert (snapshot.running, snapshot.waiting, snapshot.kv_usage_ratio) == (None, None, None)
        assert value(source, "headroom_engine_up", engine="vllm") == 0.0
        assert value(source, "headroom_source_scrape_success", source="engine") == 0.0
        # unknown is absent, never a fake zero
        assert (
            value(
                source,
                "headroom_engine_requests_running",
                engine="vllm",
                model="meta-llama/Llama-3.1-8B-Instruct",
            )
            is None
        )
        engine.mode = "ok"
        assert (await source.poll_once()).up
    finally:
        await source.stop()


async def test_oversized_page_is_refused(fake_engine, monkeypatch):
    engine, url = fake_engine
    monkeypatch.setattr("collector.sources.poller.MAX_EXPOSITION_BYTES", 1000)
    source = await started(build_engine_source("vllm", f"{url}/metrics", 60, timeout_s=ANSWER_S))
    try:
        snapshot = await source.poll_once()
        assert not snapshot.up and "more than 1000 bytes" in snapshot.error
    finally:
        await source.stop()


async def test_background_loop_follows_the_engine_and_stops_promptly(fake_engine):
    engine, url = fake_engine
    source = await started(build_engine_source("vllm", f"{url}/metrics", 0.05))
    try:
        await wait_for(lambda: source.latest.waiting == 3)
        series = 'vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"}'
        engine.metrics_text = engine.metrics_text.replace(f"{series} 3.0", f"{series} 9.0")
        await wait_for(lambda: source.latest.waiting == 9)
    finally:
        began = time.monotonic()
        await source.stop()
        assert time.monotonic() - began < 2.0
    hits = engine.metrics_hits
    await asyncio.sleep(0.2)
    assert engine.metrics_hits == hits  # no polling after stop()
    await source.stop()  # idempotent


async def test_unreachable_engine_is_down_without_raising():
    source = await started(build_engine_source("vllm", "http://127.0.0.1:9/metrics", 60, timeout_s=1))
    try:
        snapshot = await source.poll_once()
        assert not snapshot.up and snapshot.error
    finally:
        await source.stop()


async def test_llamacpp_reads_slots_and_tolerates_them_disabled(fake_engine):
    engine, url = fake_engine
    engine.metrics_text = (FIXTURES / "llamacpp/metrics_busy.txt").read_text()
    engine.slots = json.loads((FIXTURES / "llamacpp/slots_busy.json").read_text())
    source = await started(build_engine_source("llamacpp", f"{url}/metrics", 60, timeout_s=ANSWER_S))
    try:
        snapshot = await source.poll_once()
        assert (snapshot.running, snapshot.waiting, snapshot.kv_capacity_tokens) == (4, 2, 8192)
        assert snapshot.kv_usage_ratio == pytest.approx(432 / 8192)
        engine.slots = None  # llama-server --no-slots answers 501
        snapshot = await source.poll_once()
        assert snapshot.up and (snapshot.running, snapshot.kv_usage_ratio) == (4, None)
    finally:
        await source.stop()


async def test_auto_recognises_the_engine_and_labels_it(fake_engine):
    engine, url = fake_engine
    engine.metrics_text = "# TYPE something_else gauge\nsomething_else 1\n"
    source = await started(build_engine_source("auto", f"{url}/metrics", 60, timeout_s=ANSWER_S))
    try:
        snapshot = await source.poll_once()
        assert not snapshot.up and "pass --engine" in snapshot.error
        assert value(source, "headroom_engine_up", engine="auto") == 0.0
        engine.metrics_text = (FIXTURES / "sglang/metrics_v0_5.txt").read_text()
        snapshot = await source.poll_once()
        assert (snapshot.engine, snapshot.running, snapshot.waiting) == ("sglang", 9, 4)
        assert value(source, "headroom_engine_up", engine="sglang") == 1.0
        engine.mode = "error"  # a later failure keeps the learned engine label
        await source.poll_once()
        assert value(source, "headroom_engine_up", engine="sglang") == 0.0
    finally:
        await source.stop()


async def test_generic_engine_from_a_mapping_file(fake_engine):
    engine, url = fake_engine
    engine.metrics_text = (FIXTURES / "generic/metrics.txt").read_text()
    mapping = FIXTURES / "generic/mapping.yaml"
    for source in (
        build_engine_source(f"generic:{mapping}", f"{url}/metrics", 60, timeout_s=ANSWER_S),
        build_engine_source("generic", f"{url}/metrics", 60, mapping_path=mapping),
    ):
        await source.start()
        try:
            snapshot = await source.poll_once()
            assert (snapshot.engine, snapshot.running, snapshot.waiting) == ("acme", 6, 5)
        finally:
            await source.stop()


@pytest.mark.parametrize(
    "args, complaint",
    [
        (("vlm", "http://h/metrics"), "is not one of"),
        (("generic", "http://h/metrics"), "needs a mapping"),
        (("vllm:x.yaml", "http://h/metrics"), "only 'generic'"),
        (("vllm", ""), "--engine-metrics-url is empty"),
    ],
)
def test_build_engine_source_rejects_bad_input_with_a_hint(args, complaint):
    with pytest.raises(ValueError, match=complaint):
        build_engine_source(*args, 1.0)


def test_build_engine_source_none_and_defaults():
    assert build_engine_source("none", None, 1.0) is None
    assert build_engine_source("NONE", "http://h/metrics", 1.0) is None
    assert build_engine_source("vllm", "http://h/metrics", 1.0).timeout_s == 1.0
    assert build_engine_source("vllm", "http://h/metrics", 30.0).timeout_s == 2.0
    assert build_engine_source("vllm", "http://h/metrics", 0.1).timeout_s == 0.5
    assert default_metrics_url("http://h:8000/") == "http://h:8000/metrics"
    assert default_metrics_url("http://h:8000/v1") == "http://h:8000/metrics"


@pytest.mark.integration
def test_engine_with_attached_gpu_is_valid_exposition_for_promtool():
    promtool = require_tool("promtool")
    source = build_engine_source("vllm", "http://127.0.0.1:9/metrics", 1.0)
    source.latest = source.latest.__class__(
        engine="vllm", up=True, model="m", running=2, waiting=1, kv_usage_ratio=0.5, kv_capacity_tokens=64
    )
    text = generate_latest(_registry(SourceHealth([source, GpuCollector()])))
    assert text.count(b"# HELP headroom_source_scrape_success ") == 1
    assert b'headroom_source_scrape_success{source="gpu"}' in text
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=30)
    assert result.returncode == 0, result.stderr.decode() + result.stdout.decode()


def test_public_names_are_pinned():
    import collector.sources as sources

    assert sorted(sources.__all__) == [
        "ENGINES",
        "EngineSnapshot",
        "EngineSource",
        "build_engine_source",
        "default_metrics_url",
        "models_url",
    ]
    assert sources.ENGINES == ("vllm", "sglang", "tgi", "llamacpp", "generic", "auto", "none")


@pytest.mark.parametrize(
    "fixture, engine, running, waiting",
    [
        ("vllm/metrics_v0_11.txt", "vllm", 7, 3),
        ("vllm/metrics_v0_6.txt", "vllm", 12, 0),
        ("sglang/metrics_v0_5.txt", "sglang", 9, 4),
        ("tgi/metrics_v3.txt", "tgi", 5, 2),
        ("llamacpp/metrics_busy.txt", "llamacpp", 4, 2),
    ],
)
async def test_auto_over_http_on_every_engine_fixture(fake_engine, fixture, engine, running, waiting):
    fake, url = fake_engine
    fake.metrics_text = (FIXTURES / fixture).read_text()
    source = build_engine_source("auto", f"{url}/metrics", 60, timeout_s=ANSWER_S)
    try:
        snapshot = await first_polled(source)
        assert (snapshot.engine, snapshot.running, snapshot.waiting) == (engine, running, waiting), (
            snapshot.error
        )
        assert fake.metrics_hits == 1  # the page it was recognised by is the one it reports
    finally:
        await source.stop()


async def test_a_snapshot_is_stamped_when_its_poll_was_sent_not_when_the_answer_came():
    # The probe drops a snapshot older than its level; an answer that arrives late still
    # describes the engine as of the moment it was asked.
    answer = asyncio.Event()

    async def slow_scrape(fetch):
        await answer.wait()
        return EngineSnapshot(engine="vllm", up=True, waiting=2)

    source = EngineSource("vllm", slow_scrape, poll_interval_s=60, timeout_s=ANSWER_S)
    before = time.time()
    poll = asyncio.create_task(source.poll_once())
    await asyncio.sleep(0)  # the poll is sent (its scrape now waits)
    asked = time.time()
    await asyncio.sleep(0.05)
    answered = time.time()
    answer.set()
    snapshot = await poll
    assert before <= snapshot.polled_at <= asked < answered
    assert source.latest is snapshot and snapshot.waiting == 2


# --- the served model: engine series carry the model the request series carry (issue #33, 5) ---

LLAMACPP_MODEL = "/root/.cache/llm-headroom/models/gemma-3-270m-q4_k_m.gguf"  # in models.json


def _llamacpp(engine) -> None:
    """The fake engine as the real llama-server captured in tests/fixtures/llamacpp/ answers."""
    engine.metrics_text = (FIXTURES / "llamacpp/metrics_busy.txt").read_text()
    engine.slots = json.loads((FIXTURES / "llamacpp/slots_busy.json").read_text())
    engine.models = json.loads((FIXTURES / "llamacpp/models.json").read_text())


def test_served_model_reads_the_real_llama_server_model_list():
    listing = json.loads((FIXTURES / "llamacpp/models.json").read_text())
    assert served_model(listing) == LLAMACPP_MODEL
    assert served_model({"data": [{"id": "m"}, {"id": "m"}]}) == "m"  # one model, listed twice
    assert served_model({"data": [{"id": "x" * 300}]}) == "x" * 128  # the request side's cap
    assert models_url("http://h:8080") == "http://h:8080/v1/models"
    assert models_url("http://h:8080/v1/") == "http://h:8080/v1/models"


@pytest.mark.parametrize(
    "listing, complaint",
    [
        ({"data": [{"id": "a"}, {"id": "b"}]}, "lists 2 models (a, b); pass --model"),
        ({"data": []}, "lists no model"),
        ({"data": [{"id": ""}, {"object": "model"}]}, "lists no model"),
        ({"models": []}, "no 'data' array"),
        (["not", "a", "list"], "no 'data' array"),
    ],
)
def test_served_model_says_why_it_names_none(listing, complaint):
    with pytest.raises(ValueError, match=re.escape(complaint)):
        served_model(listing)


async def test_llamacpp_series_carry_the_model_its_v1_models_lists(fake_engine):
    engine, url = fake_engine
    _llamacpp(engine)
    source = build_engine_source(
        "llamacpp", f"{url}/metrics", 60, timeout_s=ANSWER_S, models_list_url=f"{url}/v1/models"
    )
    try:
        snapshot = await first_polled(source)
        assert snapshot.up and snapshot.model == LLAMACPP_MODEL
        labels = {"engine": "llamacpp", "model": LLAMACPP_MODEL}
        for name, expected in (
            ("headroom_engine_requests_running", 4),
            ("headroom_engine_requests_waiting", 2),
            ("headroom_engine_kv_cache_capacity_tokens", 8192),
            ("headroom_engine_max_concurrency_requests", 4),
        ):
            assert value(source, name, **labels) == expected, name
        assert value(source, "headroom_engine_requests_waiting", engine="llamacpp", model="") is None
        await source.poll_once()
        assert engine.models_hits == 1  # asked once, not per poll
        engine.mode = "error"  # the engine goes away ...
        assert not (await source.poll_once()).up
        engine.mode, engine.models = "ok", {"data": [{"id": "gemma-3-1b"}]}  # ... and comes back with another
        assert (await source.poll_once()).model == "gemma-3-1b"
        assert engine.models_hits == 2
    finally:
        await source.stop()


async def test_the_model_flag_names_the_engine_series_whatever_the_engine_says(fake_engine):
    engine, url = fake_engine  # vLLM labels its model meta-llama/Llama-3.1-8B-Instruct
    engine.models = {"data": [{"id": "listed"}]}
    source = build_engine_source(
        "vllm", f"{url}/metrics", 60, timeout_s=ANSWER_S, model="llama-8b", models_list_url=f"{url}/v1/models"
    )
    try:
        assert (await first_polled(source)).model == "llama-8b"
        assert value(source, "headroom_engine_requests_waiting", engine="vllm", model="llama-8b") == 3
        assert engine.models_hits == 0
    finally:
        await source.stop()
    with pytest.raises(ValueError, match="--model is empty"):
        build_engine_source("llamacpp", "http://h/metrics", 1.0, model=" ")


async def test_an_engine_that_labels_its_model_is_not_asked(fake_engine):
    engine, url = fake_engine
    engine.models = {"data": [{"id": "listed"}]}
    source = build_engine_source(
        "vllm", f"{url}/metrics", 60, timeout_s=ANSWER_S, models_list_url=f"{url}/v1/models"
    )
    try:
        assert (await first_polled(source)).model == "meta-llama/Llama-3.1-8B-Instruct"
        assert engine.models_hits == 0
    finally:
        await source.stop()


@pytest.mark.parametrize(
    "models, models_mode, why",
    [
        (None, "ok", "HTTP 404"),
        ({"data": [{"id": "a"}, {"id": "b"}]}, "ok", "lists 2 models"),
        ({"data": [{"id": "a"}]}, "hang", "no answer in time"),
    ],
)
async def test_without_a_model_name_the_engine_stays_up_and_asks_again_later(
    fake_engine, monkeypatch, caplog, models, models_mode, why
):
    engine, url = fake_engine
    _llamacpp(engine)
    engine.models, engine.models_mode = models, models_mode
    # the metrics must answer in time; a hanging /v1/models hangs for longer (until let go)
    source = build_engine_source(
        "llamacpp", f"{url}/metrics", 60, timeout_s=patient(1.0), models_list_url=f"{url}/v1/models"
    )
    try:
        with caplog.at_level("WARNING", logger="collector.sources.poller"):
            snapshot = await first_polled(source)
        assert snapshot.up and snapshot.model is None and snapshot.waiting == 2, snapshot.error
        assert value(source, "headroom_engine_requests_waiting", engine="llamacpp", model="") == 2
        warning = "\n".join(r.getMessage() for r in caplog.records)
        assert "model unknown" in warning and why in warning and "--model" in warning
        await source.poll_once()
        assert engine.models_hits == 1  # not asked again within MODEL_RETRY_S
        monkeypatch.setattr("collector.sources.poller.MODEL_RETRY_S", 0.0)
        engine.models, engine.models_mode = {"data": [{"id": "gemma"}]}, "ok"
        assert (await source.poll_once()).model == "gemma"
    finally:
        await source.stop()


# --- the HTTP client: httpx, the sidecar's only one besides its upstream pool (issue #49, 3) ---

VLLM_PAGE = (FIXTURES / "vllm/metrics_v0_11.txt").read_text()


def _vllm_source(
    client: httpx.AsyncClient | None = None, url: str = "http://engine/metrics", **kw
) -> EngineSource:
    return EngineSource("vllm", text_scraper(parse_vllm, url), poll_interval_s=60, client=client, **kw)


@pytest.mark.subprocess
def test_importing_the_sidecar_loads_no_http_client_library_for_the_poller():
    code = (
        "import sys, collector.sidecar.wiring, collector.sidecar.app, collector.sources; "
        "print(sorted(m for m in ('aiohttp', 'yarl', 'httpx') if m in sys.modules))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert loaded.stdout.strip() == "[]"  # httpx comes with the first poller started


async def test_a_client_passed_in_is_used_and_left_open():
    seen = []

    def engine(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(200, text=VLLM_PAGE)

    async with httpx.AsyncClient(transport=httpx.MockTransport(engine)) as client:
        source = _vllm_source(client)
        assert not (await source.poll_once()).up  # not started: down, not a crash
        await source.start()
        try:
            snapshot = await source.poll_once()
            assert snapshot.up and snapshot.waiting == 3
        finally:
            await source.stop()
        assert not client.is_closed  # the caller's to close
        assert seen[-1] == "http://engine/metrics"
        assert (await client.get("http://engine/metrics")).status_code == 200


@pytest.mark.parametrize(
    "failure, error",
    [
        (httpx.ConnectTimeout("timed out"), "no answer within 0.5 s"),
        (httpx.ReadTimeout("timed out"), "no answer within 0.5 s"),
        (httpx.PoolTimeout("no connection free"), "no answer within 0.5 s"),
        (httpx.ConnectError("[Errno 111] Connection refused"), "http://engine/metrics: [Errno 111]"),
        (httpx.RemoteProtocolError("Server disconnected"), "http://engine/metrics: Server disconnected"),
        (httpx.ReadError(""), "http://engine/metrics: ReadError"),
    ],
)
async def test_httpx_failures_mark_the_engine_down_as_timeouts_or_with_the_url(failure, error):
    def engine(request: httpx.Request) -> httpx.Response:
        raise failure

    async with httpx.AsyncClient(transport=httpx.MockTransport(engine)) as client:
        source = await started(_vllm_source(client, timeout_s=0.5))
        try:
            snapshot = await source.poll_once()
            assert not snapshot.up and error in snapshot.error
            assert value(source, "headroom_engine_up", engine="vllm") == 0.0
            assert value(source, "headroom_source_scrape_success", source="engine") == 0.0
        finally:
            await source.stop()


async def test_fetch_raises_timeout_error_and_scrape_error_for_what_the_callers_classify():
    def engine(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/slow":
            raise httpx.ReadTimeout("timed out", request=request)
        if request.url.path == "/gone":
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(503)

    async with httpx.AsyncClient(transport=httpx.MockTransport(engine)) as client:
        source = await started(_vllm_source(client, timeout_s=0.5))
        try:
            with pytest.raises(TimeoutError):
                await source._fetch("http://engine/slow")
            with pytest.raises(ScrapeError, match="http://engine/gone: refused"):
                await source._fetch("http://engine/gone")
            with pytest.raises(ScrapeError, match="answered HTTP 503"):
                await source._fetch("http://engine/metrics")
        finally:
            await source.stop()


async def test_a_redirect_is_followed_to_the_page():
    def engine(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(307, headers={"location": "/metrics/"})
        return httpx.Response(200, text=VLLM_PAGE)

    async with httpx.AsyncClient(transport=httpx.MockTransport(engine)) as client:
        source = await started(_vllm_source(client))
        try:
            assert (await source.poll_once()).waiting == 3
        finally:
            await source.stop()


async def test_the_poller_s_own_client_ignores_proxy_settings_in_the_environment(fake_engine, monkeypatch):
    _, url = fake_engine
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    source = await started(build_engine_source("vllm", f"{url}/metrics", 60, timeout_s=ANSWER_S))
    try:
        snapshot = await source.poll_once()
        assert snapshot.up, snapshot.error
    finally:
        await source.stop()
