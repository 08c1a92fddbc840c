"""Capacity estimates in a fleet (#35 item 5), with PostgreSQL as the catalog: a probe's estimate
saved to `headroom.capacity_estimates` (`headroom probe --catalog --lake`) is what a fleet-mode
sidecar (`headroom run --lake --catalog`) publishes for its model, and what `headroom
integrations --catalog --lake` renders; the decision is collector.store.decision's, over the
table's rows exactly as over a DuckDB file's."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families
from support.postgres import PostgresServer, postgres_server
from support.processes import HEADROOM, headroom_process, sim_process
from support.sidecar import CHAT, sidecar_rig
from support.waiting import patient, wait_until
from test_analysis_estimate import _estimate

from collector.capacity import CapacityEstimate
from collector.cli import main
from collector.lake.estimates import ESTIMATES_TABLE, fleet_decisions, read_estimates, save_to_lake
from collector.lake.layout import Lake
from collector.lake.read import open_lake_log
from collector.lake.table import commit_staged, open_catalog
from collector.sidecar.wiring import sidecar_state
from collector.store.db import RequestStore
from collector.store.decision import decisions
from collector.store.estimates import save_estimate

pytestmark = pytest.mark.subprocess  # PostgreSQL, the sidecars and the probe run as processes

_DB_COUNTER = iter(range(1_000_000))


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    with postgres_server() as server:
        yield server


@pytest.fixture
def catalog(postgres: PostgresServer) -> str:
    """A fresh PostgreSQL database as this test's catalog."""
    import sqlalchemy

    name = f"est{next(_DB_COUNTER)}_{os.getpid()}"
    engine = sqlalchemy.create_engine(postgres.url, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(sqlalchemy.text(f'CREATE DATABASE "{name}"'))  # a name we made
    engine.dispose()
    return postgres.url.rsplit("/", 1)[0] + "/" + name


_RUN_COUNTER = iter(range(1_000_000))


def _dict(model: str, knee_at: int, *, age: timedelta = timedelta(0), **fields: Any) -> CapacityEstimate:
    estimate = _estimate(model=model, knee_at=knee_at)
    fields.setdefault("run_id", f"probe-{next(_RUN_COUNTER)}")  # a run of its own: one estimate per run
    return replace(estimate, created_at=estimate.created_at - age, **fields)


def _capacity(text: str) -> dict[tuple[str, str], float]:
    """{(metric, model): value} of the headroom_capacity_* samples on a /metrics page."""
    return {
        (sample.name, sample.labels["model"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("headroom_capacity_") and "model" in sample.labels
    }


def test_fleet_decisions_equal_the_one_box_decisions_over_the_same_estimates(
    catalog: str, tmp_path: Path
) -> None:
    lake = Lake.parse(tmp_path / "lake")
    iceberg = open_catalog(catalog, lake)
    now = datetime.now(UTC)
    saved = [
        _dict("m1", 8, age=timedelta(hours=2)),  # usable probe
        _dict("m1", 16, error_ratio=0.3),  # newer, but failed: must not unseat the one above
        _dict("m2", 4, age=timedelta(days=9)),  # too old a probe, and no traffic: nothing published
        _dict("m3", 8, source="traffic", confidence="low"),  # traffic below medium confidence
    ]
    store = RequestStore()
    ids = [save_to_lake(iceberg, estimate) for estimate in saved]
    for estimate, estimate_id in zip(saved, ids, strict=True):
        save_estimate(store, estimate, estimate_id=estimate_id)
    save_to_lake(iceberg, saved[0], estimate_id=ids[0])  # a retried append after a lost reply
    fleet = fleet_decisions(iceberg, now=now)
    one_box = decisions(store, now)
    assert [(d.model, d.estimate, d.reason) for d in fleet] == [
        (d.model, d.estimate, d.reason) for d in one_box
    ]
    assert [(d.model, d.knee_requests) for d in fleet] == [("m1", 8), ("m2", None), ("m3", None)]
    assert "probe run" in fleet[0].reason and "not used: 30% of its requests failed" in fleet[0].reason
    assert [d.model for d in fleet_decisions(iceberg, models={"m2", "m9"})] == ["m2"]
    assert fleet_decisions(iceberg, models=set()) == []
    assert read_estimates(iceberg).num_rows == 5  # the retried row is stored twice, counted once


def test_a_fleet_mode_sidecar_publishes_its_models_estimate_and_keeps_it_while_the_catalog_is_away(
    tmp_path: Path,
) -> None:
    lake = tmp_path / "lake"
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(postgres_server())  # its own: stopped below, mid-test
        catalog = server.url
        iceberg = open_catalog(catalog, Lake.parse(lake))
        save_to_lake(iceberg, _dict("m1", 8))
        save_to_lake(iceberg, _dict("m2", 4))  # another model of the fleet: not this sidecar's
        started = sidecar_rig(
            tmp_path, db_path=None, lake=str(lake), spool_dir=str(tmp_path / "spool"), catalog=catalog
        )
        with started as rig:
            fleet = sidecar_state(rig.app).fleet_estimates
            # the start-up refresh: no model served yet
            assert fleet.refreshed.wait(patient(30)), fleet.last_error
            assert _capacity(httpx.get(rig.url + "/metrics").text) == {}
            assert (
                httpx.post(rig.url + "/v1/chat/completions", json=CHAT, timeout=patient(10)).status_code
                == 200
            )
            assert fleet.refresh() is not None
            published = _capacity(httpx.get(rig.url + "/metrics").text)
            assert published[("headroom_capacity_knee_requests", "m1")] == 8
            assert {model for _, model in published} == {"m1"}
            stack.close()  # PostgreSQL stops: the catalog is away
            assert fleet.refresh() is None and "OperationalError" in (fleet.last_error or "")
            assert _capacity(httpx.get(rig.url + "/metrics").text) == published


def test_catalog_without_lake_or_extra_is_refused(tmp_path: Path) -> None:
    from collector.sidecar.config import SidecarConfig
    from collector.sidecar.wiring import build_sidecar

    with pytest.raises(ValueError, match="--catalog needs --lake"):
        build_sidecar(
            SidecarConfig(
                upstream="http://127.0.0.1:1", engine="none", db_path=None, catalog="sqlite:///x.db"
            )
        )
    result = CliRunner().invoke(main, ["probe", "--url", "http://127.0.0.1:1", "--lake", str(tmp_path)])
    assert result.exit_code == 2 and "--lake needs --catalog" in result.output
    result = CliRunner().invoke(
        main,
        ["probe", "--url", "http://127.0.0.1:1", "--lake", str(tmp_path), "--db", str(tmp_path / "x.duckdb")],
    )
    assert result.exit_code == 2 and "not both" in result.output


PROBE = ["--levels", "1,2,4,8", "--max-tokens", "32", "--max-samples", "32", "--max-level-seconds", "10"]


@pytest.mark.slow
def test_a_probes_estimate_in_the_lake_is_published_by_a_fleet_sidecar_and_rendered(
    catalog: str, tmp_path: Path
) -> None:
    lake = str(tmp_path / "lake")
    fleet = ["--engine", "auto", "--engine-poll-interval", "0.2", "--lake", lake, "--catalog", catalog]
    token = {"HEADROOM_TOKEN": "fleet-token"}  # the sidecar trusts the probe's marks with it
    with sim_process(speed=1, max_num_seqs=4, seed=3) as sim:
        with headroom_process(
            "run",
            "--upstream",
            sim,
            "--instance",
            "a",
            "--spool-dir",
            str(tmp_path / "spool-a"),
            "--lake-roll-seconds",
            "1",
            *fleet,
            health="/healthz",
            env=token,
        ) as sidecar_a:
            done = subprocess.run(
                [
                    str(HEADROOM),
                    "probe",
                    "--url",
                    sidecar_a,
                    *PROBE,
                    "--json",
                    str(tmp_path / "cap.json"),
                    "--catalog",
                    catalog,
                    "--lake",
                    lake,
                ],
                capture_output=True,
                text=True,
                timeout=patient(240),
                env=os.environ | token,
            )
            assert done.returncode == 0, done.stdout + done.stderr
            assert f"saved to {ESTIMATES_TABLE}" in done.stdout
        estimate = json.loads((tmp_path / "cap.json").read_text())
        assert estimate["knee"]["reached"], estimate
        commit_staged(open_catalog(catalog, Lake.parse(lake)), Lake.parse(lake))  # sidecar a's rows
        with headroom_process(
            "run",
            "--upstream",
            sim,
            "--instance",
            "b",
            "--spool-dir",
            str(tmp_path / "spool-b"),
            "--model",
            estimate["model"],
            *fleet,
            health="/healthz",
        ) as sidecar_b:
            published = wait_until(
                lambda: _capacity(httpx.get(sidecar_b + "/metrics").text), 30, what="b's capacity gauges"
            )
    assert published[("headroom_capacity_knee_requests", estimate["model"])] == estimate["knee"]["requests"]
    pool = estimate["recommended_pool"]
    assert published[("headroom_capacity_recommended_pool_requests", estimate["model"])] == pool
    with open_lake_log(catalog, lake) as store:
        assert store.query("SELECT count(*) FROM requests WHERE instance = 'a'")[0][0] > 0
        (sources,) = store.query("SELECT list(DISTINCT source) FROM requests WHERE instance = 'a'")
        assert sources[0] == ["probe"]  # the probe's load, with the token: never the clients' traffic
    result = CliRunner().invoke(
        main, ["integrations", "keda", "--catalog", catalog, "--lake", lake, "--deployment", "llm"]
    )
    assert result.exit_code == 0, result.output
    requests_trigger = yaml.safe_load(result.output)["spec"]["triggers"][0]
    assert f"or vector({pool})" in requests_trigger["metadata"]["query"]
