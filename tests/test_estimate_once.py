"""One estimate per probe run: the probe builds its run's estimate and the owning sidecar's job
builds the same run again from the logged rows; whichever saves first keeps the run, and a second
save (collector.store.estimates.save_estimate, POST /v1/estimates, import from a --probe-db file)
inserts nothing and answers the stored estimate's id. Traffic estimates are all kept."""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.testclient import TestClient
from support.estimates import capacity_estimate
from support.owner_routes import routes_app
from support.processes import HEADROOM, free_port
from support.synthetic import synthetic_probe_run
from support.waiting import patient, wait_until

from collector.analysis.refresh import finished_probe_runs, refresh_estimates
from collector.record import RequestRecord
from collector.serving import serve_in_thread
from collector.store.capacity_gauges import CapacityGauges
from collector.store.db import RequestStore
from collector.store.estimates import import_estimates, save_estimate, save_estimate_once

_ROWS_OF = "SELECT estimate_id, knee_requests FROM capacity_estimates WHERE run_id = ? ORDER BY created_at"


@pytest.fixture
def store() -> Iterator[RequestStore]:
    store = RequestStore()
    yield store
    store.close()


def _probe(run_id: str | None, knee: int, *, age: timedelta = timedelta(0), **fields: Any):
    created = datetime.now(UTC) - timedelta(hours=1) - age
    return capacity_estimate(
        "m", source="probe", run_id=run_id, knee_requests=knee, knee_tokens=1000, created_at=created, **fields
    )


def test_a_probe_runs_second_save_inserts_nothing_and_answers_the_first(store):
    first = save_estimate_once(store, _probe("probe-1", 8))
    again = save_estimate_once(store, _probe("probe-1", 8))
    assert not first.already_stored and again == dataclasses.replace(first, already_stored=True)
    # the same run under another label (the probe's --replica-class) or knee: still the run's one
    assert save_estimate(store, _probe("probe-1", 4, replica_class="l40s-8")) == first.estimate_id
    assert store.query(_ROWS_OF, ["probe-1"]) == [(first.estimate_id, 8)]
    other = save_estimate_once(store, _probe("probe-2", 4))  # another run is saved
    assert not other.already_stored and other.estimate_id != first.estimate_id
    assert store.query("SELECT count(*) FROM capacity_estimates")[0][0] == 2


def test_traffic_estimates_and_probe_estimates_without_a_run_are_all_kept(store):
    traffic = capacity_estimate("m", source="traffic", knee_requests=8, confidence="high")
    ids = {save_estimate(store, traffic) for _ in range(3)}
    ids |= {save_estimate(store, _probe(None, 8)) for _ in range(2)}
    assert len(ids) == 5
    assert store.query("SELECT count(*) FROM capacity_estimates")[0][0] == 5


def test_the_jobs_estimate_of_a_run_keeps_it_against_the_probes_own(store):
    """The owning sidecar's job estimated the run from its rows first; the probe's estimate of the
    same run, saved afterwards, is not a second row."""
    ran_at = datetime.now(UTC) - timedelta(hours=2)
    store.insert_rows(synthetic_probe_run(ran_at, model="m"))  # run-1, knee 8
    jobs = refresh_estimates(store, None, ran_at + timedelta(hours=1), window=timedelta(hours=2))
    assert [(e["run_id"], e["knee"]["requests"]) for e in jobs] == [("run-1", 8)]
    [(job_id, knee)] = store.query(_ROWS_OF, ["run-1"])
    assert knee == 8
    probes = save_estimate_once(store, _probe("run-1", 4))
    assert probes.already_stored and probes.estimate_id == job_id
    assert store.query(_ROWS_OF, ["run-1"]) == [(job_id, 8)]


def _probe_request(run_id: str, n: int, admitted: datetime, e2e_s: float, *, warmup: bool) -> dict:
    return RequestRecord(
        request_id=f"{run_id}-{n}",
        source="probe",
        run_id=run_id,
        model="m",
        admitted_at=admitted,
        completed_at=admitted + timedelta(seconds=e2e_s),
        e2e_s=e2e_s,
        outcome="ok",
        status_code=200,
        probe_level=1,
        probe_warmup=warmup,
    ).as_row()


def test_a_run_is_not_finished_while_a_request_as_long_as_its_longest_may_still_run(store):
    """Level 1's warm-up request took 30 s and ended; the first measured one, sent as it ended,
    is still running: the run is not finished 10 s later, only once a request as long as its
    longest could have ended too (else the job estimates it from its warm-up alone: nothing)."""
    start = datetime(2026, 1, 5, 12, tzinfo=UTC)
    store.insert_rows([_probe_request("slow-run", 0, start, 30.0, warmup=True)])
    warm_end = start + timedelta(seconds=30)
    assert finished_probe_runs(store, warm_end + timedelta(seconds=15), 10.0) == []
    assert finished_probe_runs(store, warm_end + timedelta(seconds=39), 10.0) == []
    assert finished_probe_runs(store, warm_end + timedelta(seconds=41), 10.0) == ["slow-run"]
    # its measured request arrives in time: the job then estimates the run from it, not nothing
    store.insert_rows([_probe_request("slow-run", 1, warm_end, 30.0, warmup=False)])
    assert finished_probe_runs(store, warm_end + timedelta(seconds=41), 10.0) == []


def test_the_job_looks_at_probe_runs_once_the_rows_the_writer_holds_are_in(store):
    """A sidecar's log writer holds rows back: the job first has it write them (`rows_written`),
    so a run whose later rows were still queued is not taken for finished after its warm-up."""
    start = datetime(2026, 1, 5, 12, tzinfo=UTC)
    now = start + timedelta(minutes=1)
    store.insert_rows([_probe_request("queued-run", 0, start, 0.1, warmup=True)])
    queued = [_probe_request("queued-run", n, now - timedelta(seconds=1), 0.5, warmup=False) for n in (1, 2)]
    flushed = []

    def rows_written() -> None:  # what LogWriter.flush does: the queued rows reach the store
        flushed.append(store.insert_rows(queued))

    refresh_estimates(store, None, now, window=timedelta(hours=1), traffic=False, rows_written=rows_written)
    assert flushed == [2] and finished_probe_runs(store, now, 10.0) == []
    assert not _examined(store, "queued-run")


def test_a_file_saved_before_the_rule_answers_its_runs_first_estimate(store):
    """Two rows of one run (saved by a release without the rule): the first is the run's."""
    save_estimate(store, _probe("probe-1", 8, age=timedelta(minutes=5)))
    store.execute(
        "INSERT INTO capacity_estimates SELECT 'est-later', created_at + INTERVAL 1 MINUTE, model, source, "
        "run_id, profile, knee_requests, knee_tokens, knee_reached, slo_max, recommended_pool, confidence, "
        "estimate_json, task_class, replica_class FROM capacity_estimates"
    )
    [(first, _), (later, _)] = store.query(_ROWS_OF, ["probe-1"])
    assert later == "est-later"
    assert save_estimate_once(store, _probe("probe-1", 8)).estimate_id == first
    assert len(store.query(_ROWS_OF, ["probe-1"])) == 2


def test_importing_a_probe_db_skips_a_run_the_job_already_estimated(tmp_path):
    theirs = RequestStore(tmp_path / "probe.duckdb")
    save_estimate(theirs, _probe("probe-1", 4))  # the probe's, in its own --db file
    save_estimate(theirs, _probe("probe-2", 4))
    theirs.close()
    ours = RequestStore(tmp_path / "sidecar.duckdb")
    try:
        job_id = save_estimate(ours, _probe("probe-1", 8))  # the sidecar's job went first
        assert import_estimates(ours, tmp_path / "probe.duckdb") == 1  # probe-2 only
        assert import_estimates(ours, tmp_path / "probe.duckdb") == 0
        assert ours.query(_ROWS_OF, ["probe-1"]) == [(job_id, 8)]
        assert [row[1] for row in ours.query(_ROWS_OF, ["probe-2"])] == [4]
    finally:
        ours.close()


def test_the_estimates_route_answers_the_stored_id_for_a_runs_second_save_and_republishes(store):
    gauges = CapacityGauges()
    auth = {"Authorization": "Bearer t"}
    with TestClient(routes_app(store, "t", gauges=gauges)) as client:
        body = orjson.loads(orjson.dumps(_probe("probe-1", 8).to_dict()))
        first = client.post("/v1/estimates", json=body, headers=auth)
        assert first.status_code == 200 and first.json()["already_stored"] is False
        second = client.post("/v1/estimates", json=body, headers=auth)
        assert second.status_code == 200
        assert second.json() == {"estimate_id": first.json()["estimate_id"], "already_stored": True}
        assert store.query("SELECT count(*) FROM capacity_estimates")[0][0] == 1
        # a run the job stored without publishing yet: the probe's duplicate still republishes
        save_estimate(store, _probe("probe-2", 16, age=timedelta(minutes=-30), task_class="chat"))
        assert gauges.get("m", "chat") is None
        duplicate = orjson.loads(orjson.dumps(_probe("probe-2", 2, task_class="chat").to_dict()))
        answer = client.post("/v1/estimates", json=duplicate, headers=auth).json()
        assert answer["already_stored"] is True
        published = gauges.get("m", "chat")
        assert published is not None and published.knee_requests == 16


def _examined(store: RequestStore, run_id: str) -> bool:
    """Whether the sidecar's probe-run job has looked at `run_id` (collector.analysis.refresh)."""
    table = "SELECT count(*) FROM information_schema.tables WHERE table_name = 'probe_runs_examined'"
    if not store.query(table)[0][0]:
        return False
    return bool(store.query("SELECT count(*) FROM probe_runs_examined WHERE run_id = ?", [run_id])[0][0])


def _gate(owner_url: str, store: RequestStore) -> FastAPI:
    """The owner's routes, forwarded as they are, except that a probe's estimate waits until the
    sidecar's job has examined its run: the job always saves first, the probe's save comes second."""
    app = FastAPI()

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def forward(path: str, request: Request) -> Response:
        body = await request.body()
        if request.method == "POST" and path.endswith("v1/estimates"):
            run_id = orjson.loads(body)["run_id"]
            await run_in_threadpool(
                wait_until, lambda: _examined(store, run_id), 20.0, what=f"the job examines {run_id}"
            )
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
        async with httpx.AsyncClient(timeout=60) as client:
            answer = await client.request(
                request.method,
                f"{owner_url}/{path}",
                content=body,
                headers=headers,
                params=request.query_params,
            )
        return Response(answer.content, answer.status_code, media_type=answer.headers.get("content-type"))

    return app


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_probe_through_its_owning_sidecar_leaves_one_estimate_of_its_run(tmp_path, monkeypatch):
    """`headroom probe --url <sidecar> --db <the sidecar's file>` against the simulator: the sidecar
    logs the run, its job estimates it and saves that first (the probe's POST is held until then),
    the probe's own estimate of the run is then answered "already stored": one row for the run."""
    from collector.sidecar import wiring
    from collector.sidecar.config import SidecarConfig
    from collector.sidecar.wiring import build_sidecar, sidecar_state
    from collector.sim.app import create_sim_app
    from collector.sim.config import SimConfig

    monkeypatch.delenv("HEADROOM_TOKEN", raising=False)  # the probe takes the owner's token file
    job_settings = wiring.job_settings

    def quick_jobs(config: SidecarConfig) -> Any:  # a run is finished soon after it, checked often
        settings = job_settings(config)
        # quiet for longer than a row takes into the store: the log writer holds rows for up to
        # its flush interval, and a job that looked sooner could see the run's warm-up alone
        quiet_s = config.log_flush_interval_s + patient(0.5)
        return dataclasses.replace(
            settings, probe_check_interval_s=0.1, probe_quiet_s=quiet_s, estimate_interval_s=0
        )

    monkeypatch.setattr(wiring, "job_settings", quick_jobs)
    db, port = tmp_path / "owned.duckdb", free_port()
    handles = []
    try:
        sim = serve_in_thread(
            create_sim_app(SimConfig(model="m", max_num_seqs=2, speed=8.0, stream_interval=4))
        )
        handles.append(sim)
        config = SidecarConfig(upstream=sim.url, engine="none", db_path=str(db), jobs=True, listen_port=port)
        app = build_sidecar(config)
        sidecar = serve_in_thread(app, port=port, timeout_graceful_shutdown=5)
        handles.append(sidecar)
        store = sidecar_state(app).batch_sink
        owner_file = Path(f"{db}.owner")
        owner = orjson.loads(owner_file.read_bytes())
        gate = serve_in_thread(_gate(owner["url"], store))
        handles.append(gate)
        owner_file.write_bytes(orjson.dumps(owner | {"url": gate.url}))
        command = [
            str(HEADROOM), "probe", "--url", sidecar.url, "--db", str(db), "--levels", "1,2,4",
            "--max-tokens", "16", "--max-samples", "12", "--max-level-seconds", "3",
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=patient(60), check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        [run_id] = [
            row[0] for row in store.query("SELECT DISTINCT run_id FROM requests WHERE source = 'probe'")
        ]
        assert store.query("SELECT estimated FROM probe_runs_examined WHERE run_id = ?", [run_id]) == [
            (True,)
        ]
        assert store.query("SELECT count(*) FROM capacity_estimates WHERE run_id = ?", [run_id]) == [(1,)]
        # of the whole run: the job waited for its last rows (the log writer holds rows back)
        [(kept,)] = store.query("SELECT estimate_json FROM capacity_estimates WHERE run_id = ?", [run_id])
        measured = (
            "SELECT DISTINCT probe_level FROM requests WHERE run_id = ? AND NOT probe_warmup ORDER BY 1"
        )
        assert [level["concurrency"] for level in orjson.loads(kept)["levels"]] == [
            row[0] for row in store.query(measured, [run_id])
        ]
        assert f"probe run {run_id}: its estimate est-" in done.stdout
        assert "was already stored in --db" in done.stdout
    finally:
        for handle in reversed(handles):
            handle.stop()
