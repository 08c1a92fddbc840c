"""The probe against a tiny fake OpenAI server of our own: rows and their schema, TTFT on the
first content chunk, 429s counted and never retried, early stop when saturated, dead-URL fail
fast, and the CLI's JSON, plot (opened with Pillow) and request log."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest
from click.testing import CliRunner
from conftest import free_port
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from PIL import Image
from support.processes import HEADROOM

from collector.analysis.probe import ProbeError, ProbeSettings, _Level, run_probe
from collector.analysis.recommend import recommended_pool
from collector.cli import main
from collector.inflight import Inflight
from collector.serving import serve_in_thread
from collector.sidecar.wiring import sidecar_state
from collector.sources.base import EngineSnapshot
from collector.store.db import RequestStore
from collector.store.schema import COLUMN_NAMES

TOKEN_DELAY_S = 0.012
TOKENS = 8


def fake_app(
    slots: int = 4, reject_every: int = 0, api_key: str | None = None, stall_s: float = 0.0
) -> FastAPI:
    """OpenAI-ish server with `slots` concurrent streams; every `reject_every`-th request gets 429;
    with `api_key`, requests without that bearer token get 401."""
    app = FastAPI()
    app.state.requests = 0
    gate = asyncio.Semaphore(slots)

    def sse(obj) -> bytes:
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    async def stream(chat: bool = True):
        if stall_s:
            await asyncio.sleep(stall_s)
        if chat:
            yield sse({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})  # not a token
        async with gate:
            for _ in range(TOKENS):
                await asyncio.sleep(TOKEN_DELAY_S)
                choice = {"delta": {"content": "tok "}} if chat else {"text": "tok "}
                yield sse({"choices": [{"index": 0} | choice]})
        yield sse({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": TOKENS}})
        yield b"data: [DONE]\n\n"

    @app.get("/v1/models")
    async def models():
        return {"data": [{"id": "fake-model"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        app.state.requests += 1
        app.state.last_headers = dict(request.headers)
        if api_key and request.headers.get("authorization") != f"Bearer {api_key}":
            return JSONResponse({"error": {"message": "bad key"}}, status_code=401)
        if reject_every and app.state.requests % reject_every == 0:
            return JSONResponse({"error": {"message": "slow down"}}, status_code=429)
        return StreamingResponse(stream(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request):
        app.state.requests += 1
        body = await request.json()
        assert "prompt" in body and "messages" not in body
        return StreamingResponse(stream(chat=False), media_type="text/event-stream")

    return app


def requests_sent(handle) -> int:
    """How many chat requests the fake server behind `handle` received."""
    return handle.server.config.app.state.requests


@pytest.fixture
def serve():
    handles = []

    def start(app):
        handles.append(serve_in_thread(app))
        return handles[-1]

    yield start
    for handle in handles:
        handle.stop()


def quick(url: str, **overrides) -> ProbeSettings:
    options = dict(
        url=url, levels=(1, 2, 4, 8), max_tokens=TOKENS, min_samples=6, max_samples=40, max_level_s=10.0
    )
    return ProbeSettings(**(options | overrides))


@pytest.mark.serial  # the fake's four slots in real seconds (12 ms a token): a real-time knee
async def test_rows_schema_concurrency_and_knee(serve):
    server = serve(fake_app(slots=4))
    written: list[dict] = []
    result = await run_probe(quick(server.url), write_rows=written.extend)
    assert result.model == "fake-model" and result.run_id.startswith("probe-")
    assert [lv.concurrency for lv in result.levels] == [1, 2, 4, 8]
    assert len(written) == sum(len(lv.rows) for lv in result.levels) == requests_sent(server)
    for row in written:
        assert set(row) == set(COLUMN_NAMES)
        assert row["source"] == "probe" and row["run_id"] == result.run_id
        assert row["usage_source"] == "upstream" and row["completion_tokens"] == TOKENS
    for level in result.levels:
        measured = [r for r in level.rows if not r["probe_warmup"]]
        assert measured and all(r["inflight_at_admit"] == level.concurrency for r in measured)
        assert level.stats.littles_law.consistent
    # TTFT is stamped on the first content chunk, not on the role chunk sent at once
    assert min(r["ttft_s"] for r in written) >= TOKEN_DELAY_S * 0.9
    from collector.analysis.knee import detect_knee

    assert detect_knee([lv.stats for lv in result.levels]).requests == 4


async def test_429_is_a_failure_and_never_retried(serve):
    server = serve(fake_app(slots=64, reject_every=3))
    written: list[dict] = []
    result = await run_probe(quick(server.url, levels=(1, 2)), write_rows=written.extend)
    assert len(written) == requests_sent(server)  # one row per request sent
    limited = [r for r in written if r["outcome"] == "rate_limited"]
    assert limited and all(r["status_code"] == 429 and r["ttft_s"] is None for r in limited)
    assert result.levels[0].stats.rate_limited_ratio == pytest.approx(1 / 3, abs=0.15)


async def test_saturated_server_stops_early_and_says_why(serve):
    server = serve(fake_app(reject_every=1))  # every request is refused
    result = await run_probe(quick(server.url))
    assert [lv.concurrency for lv in result.levels] == [1]
    assert (
        "saturated" in result.stopped_early
        and "3 capacity errors (429/503/timeouts) in 3" in result.stopped_early
    )
    assert requests_sent(server) <= 8  # gave up after a handful


async def test_api_key_is_sent_and_never_stored(serve):
    server = serve(fake_app(slots=8, api_key="sk-secret"))
    written: list[dict] = []
    result = await run_probe(quick(server.url, levels=(1,), api_key="sk-secret"), write_rows=written.extend)
    assert result.levels[0].stats.error_ratio == 0
    headers = server.server.config.app.state.last_headers
    assert headers["x-tenant-id"] == "headroom-probe" and headers["x-headroom-run-id"] == result.run_id
    assert "sk-secret" not in repr(written)
    assert "sk-secret" not in repr(quick(server.url, api_key="sk-secret"))
    refused = await run_probe(quick(server.url, levels=(1, 2)))
    assert refused.levels[0].rows[0]["outcome"] == "bad_request"
    assert "failing" in refused.stopped_early and "HTTP 401" in refused.stopped_early


async def test_completions_endpoint_and_timeouts(serve):
    server = serve(fake_app(slots=8))
    result = await run_probe(quick(server.url, levels=(2,), endpoint="/v1/completions"))
    rows = result.levels[0].rows
    assert all(r["endpoint"] == "/v1/completions" and r["ttft_s"] > 0 for r in rows)
    stalled = serve(fake_app(slots=8, stall_s=5.0))
    result = await run_probe(quick(stalled.url, levels=(1, 2), request_timeout_s=0.3))
    assert {r["outcome"] for r in result.levels[0].rows} == {"timeout"}
    assert result.stopped_early and "saturated" in result.stopped_early


async def test_dead_url_fails_fast_with_a_clear_message():
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(ProbeError, match=rf"cannot reach {url}.*check --url"):
        await run_probe(quick(url))
    assert time.monotonic() - started < 5


def test_cli_dead_url_exits_non_zero():
    result = CliRunner().invoke(main, ["probe", "--url", f"http://127.0.0.1:{free_port()}"])
    assert result.exit_code == 1 and "cannot reach" in result.output


def test_cli_writes_json_plot_and_request_log(serve, tmp_path):
    """The CLI's printed knee and pool, its JSON and the estimate it saves agree, the pool follows
    --profile and --slo-ttft-p95, the plot and page are written, the rows logged. Which level the
    knee is, is a wall-clock measurement of a fake in this process (a busy host measured 8, the
    ladder's top, as a lower bound): test_rows_schema_concurrency_and_knee holds it to the fake's
    4 slots, alone (marker `serial`)."""
    server = serve(fake_app(slots=4))
    paths = {name: tmp_path / name for name in ("cap.json", "cap.png", "log.duckdb")}
    result = CliRunner().invoke(
        main,
        [
            "probe",
            "--url",
            server.url,
            "--levels",
            "1,2,4,8",
            "--max-tokens",
            str(TOKENS),
            "--max-samples",
            "30",
            "--slo-ttft-p95",
            "0.05",
            "--profile",
            "interactive",
            "--json",
            str(paths["cap.json"]),
            "--plot",
            str(paths["cap.png"]),
            "--db",
            str(paths["log.duckdb"]),
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(paths["cap.json"].read_text())
    knee, pool = data["knee"]["requests"], data["recommended_pool"]
    assert knee in (1, 2, 4, 8) and (data["profile"], data["slo"]["ttft_p95_s"]) == ("interactive", 0.05)
    assert pool == recommended_pool(knee, data["slo_max"], "interactive"), data
    assert f"knee: {knee} requests" in result.output, result.output
    assert f"recommended pool (interactive): {pool}" in result.output, result.output
    with Image.open(paths["cap.png"]) as image:
        image.load()
        assert (image.format, image.size) == ("PNG", (1200, 800))
    page = (tmp_path / "cap.html").read_text()
    assert "data:image/png;base64," in page and "<table>" in page
    store = RequestStore(paths["log.duckdb"])
    assert store.query("SELECT count(*), min(source), max(source), count(DISTINCT run_id) FROM requests")[0][
        1:
    ] == ("probe", "probe", 1)
    assert store.query("SELECT knee_requests, recommended_pool FROM capacity_estimates") == [(knee, pool)]
    store.close()


def test_cli_plot_draws_the_open_loop_ladder_when_rates_ran(serve, tmp_path):
    """--plot with --rates: the knee's PNG, the open-loop PNG beside it (cap-rates.png, drawn,
    not blank), both embedded in the page; without --rates no rates PNG."""
    server = serve(fake_app(slots=4))
    args = ["probe", "--url", server.url, "--levels", "2,4", "--max-tokens", str(TOKENS)]
    args += ["--max-samples", "12", "--max-level-seconds", "2"]
    rates = ["--rates", "5,10", "--rate-seconds", "1", "--rate-warmup-seconds", "0.2"]
    result = CliRunner().invoke(main, [*args, *rates, "--plot", str(tmp_path / "cap.png")])
    assert result.exit_code == 0, result.output
    assert f"wrote {tmp_path / 'cap.png'}, {tmp_path / 'cap-rates.png'} and" in result.output
    with Image.open(tmp_path / "cap-rates.png") as image:
        assert (image.format, image.size) == ("PNG", (1200, 800))
        assert len(image.convert("L").getcolors(maxcolors=100_000)) > 10  # something is drawn
    page = (tmp_path / "cap.html").read_text()
    assert page.count("data:image/png;base64,") == 2 and "open-loop plot" in page
    plain = CliRunner().invoke(main, [*args, "--plot", str(tmp_path / "knee.png")])
    assert plain.exit_code == 0, plain.output
    assert (tmp_path / "knee.png").stat().st_size > 10_000 and not (tmp_path / "knee-rates.png").exists()
    assert (tmp_path / "knee.html").read_text().count("data:image/png;base64,") == 1


def test_cli_rejects_bad_levels_and_prompts():
    runner = CliRunner()
    bad = runner.invoke(main, ["probe", "--url", "http://x", "--levels", "1,two"])
    assert bad.exit_code == 2 and "comma-separated" in bad.output
    missing = runner.invoke(main, ["probe", "--url", "http://x", "--prompts", "/no/such/file"])
    assert missing.exit_code == 2 and "one prompt per line" in missing.output


@pytest.mark.subprocess
def test_cli_sends_rows_and_estimate_to_the_sidecar_that_owns_db(serve, tmp_path, monkeypatch):
    """`probe --db` on a file a sidecar owns: rows to its ingest route, the estimate to its estimates
    route (collector.store.owner); a token it refuses is one line naming HEADROOM_TOKEN."""
    from collector.sidecar.config import SidecarConfig
    from collector.sidecar.wiring import build_sidecar

    monkeypatch.delenv("HEADROOM_TOKEN", raising=False)
    server = serve(fake_app(slots=8))
    db, port = tmp_path / "owned.duckdb", free_port()
    app = build_sidecar(
        SidecarConfig(upstream=server.url, engine="none", db_path=str(db), jobs=False, listen_port=port)
    )
    sidecar = serve_in_thread(app, port=port, timeout_graceful_shutdown=5)
    args = [str(HEADROOM), "probe", "--url", server.url, "--levels", "1,2", "--max-tokens", str(TOKENS)]

    def probe(samples: int) -> subprocess.CompletedProcess[str]:  # another process: DuckDB's lock
        command = [*args, "--max-samples", str(samples), "--db", str(db)]
        return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)

    try:
        result = probe(12)
        assert result.returncode == 0, result.stdout + result.stderr
        store = sidecar_state(app).batch_sink
        sent = store.query("SELECT count(*), min(source), count(DISTINCT run_id) FROM requests")[0]
        assert sent == (requests_sent(server), "probe", 1)
        assert store.query("SELECT count(*) FROM capacity_estimates")[0][0] == 1
        monkeypatch.setenv("HEADROOM_TOKEN", "not-the-owners")  # the owner read its token from the file
        Path(f"{db}.owner").write_text(Path(f"{db}.owner").read_text().replace('"file"', '"env"'))
        refused = probe(4)
        assert refused.returncode == 1
        assert "refused the token; set HEADROOM_TOKEN to the owner's" in refused.stderr
        assert "Traceback" not in refused.stderr and "httpx" not in refused.stderr
    finally:
        sidecar.stop()


async def test_a_level_ends_when_p95_ttft_stops_drifting_or_at_the_cap(serve):
    """Stable latency ends a level early; a level that never settles runs to the sample cap."""
    server = serve(fake_app(slots=64))
    settled = await run_probe(quick(server.url, levels=(2,), max_samples=200, drift_tolerance=0.5))
    level = settled.levels[0]
    assert level.ended_by.startswith("p95 TTFT stable") and level.stats.samples < 200
    never = await run_probe(quick(server.url, levels=(2,), max_samples=30, drift_tolerance=0.0))
    assert never.levels[0].ended_by == "sample cap 30" and never.levels[0].stats.samples >= 30


def test_a_level_reads_the_engine_queue_only_from_polls_sent_during_it():
    """A poll sent before the level began (the level below's queue, or a poll stuck on a busy
    host) gives no waiting count instead of the wrong one; the next fresh poll gives it again."""
    engine = SimpleNamespace(
        latest=EngineSnapshot(engine="vllm", up=True, waiting=0, polled_at=time.time() - 1)
    )
    level = _Level(4, quick("http://127.0.0.1:9"), Inflight(), engine)  # type: ignore[arg-type]
    assert level.waiting() is None
    engine.latest = EngineSnapshot(engine="vllm", up=True, waiting=1, polled_at=level.started + 0.01)
    assert level.waiting() == 1
    assert _Level(4, quick("http://127.0.0.1:9"), Inflight()).waiting() is None  # no engine source
