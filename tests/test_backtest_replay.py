"""Replaying a request log through the rules: from a DuckDB file, from the fleet's table, from the demo.

A simulated scenario's rows, written to a real DuckDB file and read back, rebuild exactly the
sidecar series the scenario itself exported (one code path for both), LoRA adapters included; the
fleet's Iceberg table gives the same records; what rows cannot tell is named as missing; and a log written by
`headroom demo` replays end to end with the knee alert firing from the level where the demo's load
crossed the knee it reports. The command line's errors name the bad input.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime

import pytest
from click.testing import CliRunner
from conftest import require_tool

from collector.backtest.exposition import HISTOGRAMS
from collector.backtest.replay import ENGINE_SIDE, from_db, missing_series, replay_series
from collector.backtest.run import generated_rules
from collector.backtest.scenario import Scenario, constant
from collector.backtest.scenario_series import scenario_series
from collector.backtest.simulate import simulate
from collector.capacity import CapacityEstimate, KneeResult, Slo
from collector.cli import main
from collector.lake.layout import Lake
from collector.lake.stage import LakeWriter
from collector.lake.table import commit_staged, open_catalog
from collector.rules.config import DEFAULT
from collector.store.db import RequestStore
from collector.store.estimates import save_estimate

SIDECAR = {
    "headroom_inflight_requests",
    "headroom_active_tokens",
    "headroom_requests_total",
    "headroom_prompt_tokens_total",
    "headroom_generated_tokens_total",
    "up",
} | {f"{name}_{suffix}" for name in HISTOGRAMS for suffix in ("bucket", "sum", "count")}


def _estimate(model: str, created: float) -> CapacityEstimate:
    """A saved estimate: a knee of 32 requests and a token capacity of 40k (p95 52k), pool 24."""
    knee = KneeResult(32, 40000, True, "plateau", 32, 32, True, "")
    return CapacityEstimate(
        model,
        "probe",
        None,
        "interactive",
        [],
        knee,
        Slo(),
        28,
        30000,
        24,
        created_at=datetime.fromtimestamp(created, UTC),
        token_capacity={"mean": 40000, "p95": 52000, "max_request_tokens": 1600},
    )


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """Half an hour at 60 % of the knee, simulated, its finished rows in a DuckDB file with an estimate."""
    result = simulate(Scenario("replay", "", 1800, constant(0.6), seed=5))
    path = tmp_path_factory.mktemp("replay") / "log.duckdb"
    store = RequestStore(path)
    store.insert_rows([r.to_row() for r in result.records if r.completed is not None])
    save_estimate(store, _estimate("llama-70b", result.epoch - 3600))
    store.close()
    return result, path


def _sidecar_samples(series, until: float) -> dict:
    return {
        key: [(t, v) for t, v in series.samples(key) if t <= until]
        for key in series.keys()
        if key[0] in SIDECAR
    }


def test_rows_read_back_rebuild_the_series_the_scenario_exported(logged):
    result, path = logged
    # the window starts at the whole second of the first admission (Prometheus answers in ms)
    assert from_db(str(path)).start == math.floor(min(r.admitted for r in result.records))
    log = from_db(str(path), since=datetime.fromtimestamp(result.epoch, UTC))  # the scenario's scrape grid
    assert len(log.records) == sum(r.completed is not None for r in result.records) > 1000
    replayed = replay_series(log, "headroom-sidecar", 15)
    exported = scenario_series(result, "headroom-sidecar")
    # requests still in flight at the scenario's end have no row yet; compare the time before them
    until = min(r.admitted for r in result.records if r.completed is None) - 1
    mine = _sidecar_samples(exported, until)
    theirs = {key: [(t, v) for t, v in replayed.samples(key) if t <= until] for key in mine}
    assert len(mine) > 50 and mine.keys() == theirs.keys()
    for key, points in mine.items():  # equal, but for the microseconds a TIMESTAMPTZ keeps in the sums
        assert [t for t, _ in points] == [t for t, _ in theirs[key]]
        assert [v for _, v in points] == pytest.approx([v for _, v in theirs[key]], rel=1e-5), key
    knees = {
        key[0]: replayed.samples(key)[0][1]
        for key in replayed.keys()
        if key[0].startswith("headroom_capacity_")
    }
    assert knees == {
        "headroom_capacity_knee_requests": 32.0,
        "headroom_capacity_knee_tokens": 40000.0,
        "headroom_capacity_knee_tokens_p95": 52000.0,
        "headroom_capacity_recommended_pool_requests": 24.0,
    }
    assert not {key[0] for key in replayed.keys()} & set(ENGINE_SIDE), "engine series are never invented"


def test_a_log_of_adapter_requests_replays_the_adapter_series_the_scenario_exported(tmp_path):
    """Rows that name a LoRA adapter carry it back: the replay rebuilds the per-adapter in-flight
    series HeadroomAdapterThrash reads; the engine's slots are named as missing, never invented."""
    import dataclasses

    from collector.backtest.scenarios import SCENARIOS

    thrash = dataclasses.replace(SCENARIOS["adapter_thrash"], duration_s=600, adapters=lambda t: 8)
    result = simulate(thrash)
    path = tmp_path / "log.duckdb"
    store = RequestStore(path)
    store.insert_rows([r.to_row() for r in result.records if r.completed is not None])
    store.close()
    replayed = replay_series(from_db(str(path), since=datetime.fromtimestamp(result.epoch, UTC)), "job", 15)
    exported = scenario_series(result, "job")
    until = min((r.admitted for r in result.records if r.completed is None), default=result.epoch + 600) - 1
    adapter_keys = [
        k
        for k in exported.keys()
        if k[0] in ("headroom_adapter_inflight_requests", "headroom_adapters_inflight")
    ]
    assert len(adapter_keys) == 9  # eight adapters and the distinct count
    for key in adapter_keys:
        mine = [(t, v) for t, v in exported.samples(key) if t <= until]
        assert mine and [(t, v) for t, v in replayed.samples(key) if t <= until] == mine, key
    (distinct,) = [k for k in adapter_keys if k[0] == "headroom_adapters_inflight"]
    assert max(v for _, v in replayed.samples(distinct)) > 4  # more adapters in flight than slots
    assert "headroom_adapter_slots" not in {k[0] for k in replayed.keys()}


def test_what_rows_cannot_tell_is_named():
    rules = generated_rules(DEFAULT)
    needed, blind = missing_series(rules.alerts(), rules.records())
    assert {
        "headroom_engine_requests_waiting",
        "headroom_engine_kv_cache_usage_ratio",
        "headroom_log_sink_up",
    } <= set(needed)
    assert {"HeadroomKVCacheNearFull", "HeadroomQueueNotDraining", "HeadroomLogSinkDown"} <= set(blind)
    assert "HeadroomTTFTBudgetBurnFast" not in blind and "HeadroomConcurrencyNearKnee" not in blind


def test_the_fleets_table_gives_the_same_records(logged, tmp_path):
    """The same rows staged by a LakeWriter and committed: the replay reads the table as the file."""
    result, path = logged
    store = RequestStore(path, read_only=True)
    rows = store.query_dicts("SELECT * FROM requests")
    store.close()
    lake, catalog = str(tmp_path / "lake"), f"sqlite:///{tmp_path / 'catalog.db'}"
    writer = LakeWriter(lake, "box", tmp_path / "spool", roll_seconds=3600)
    writer.write_batch(rows)
    writer.close()
    commit_staged(open_catalog(catalog, Lake.parse(lake)), Lake.parse(lake))
    since = datetime.fromtimestamp(result.epoch, UTC)
    fleet = from_db(None, since, catalog=catalog, lake=lake)
    local = from_db(str(path), since=since)
    assert sorted(r.request_id for r in fleet.records) == sorted(r.request_id for r in local.records)
    pairs = {r.request_id: r for r in local.records}
    assert all(abs(r.completed - pairs[r.request_id].completed) < 1e-5 for r in fleet.records)
    assert fleet.source == f"--lake {lake}" and fleet.capacities == []  # estimates live beside --db
    runner = CliRunner()
    no_since = runner.invoke(main, ["alerts", "backtest", "--lake", lake, "--catalog", catalog])
    assert no_since.exit_code == 1 and "--lake needs --since" in no_since.output
    no_catalog = runner.invoke(
        main, ["alerts", "backtest", "--lake", lake, "--since", "24h"], env={"HEADROOM_CATALOG": ""}
    )
    assert no_catalog.exit_code == 1 and "--lake needs --catalog" in no_catalog.output


@pytest.mark.integration
@pytest.mark.slow
def test_a_demo_log_replays_and_the_knee_alert_fires_where_the_load_crossed_the_knee(tmp_path):
    require_tool("prometheus")
    db, summary_path = tmp_path / "demo.duckdb", tmp_path / "demo.json"
    demo = CliRunner().invoke(
        main,
        [
            "demo",
            "--speed",
            "8",
            "--levels",
            "4,16,32",
            "--level-seconds",
            "5",
            "--db",
            str(db),
            "--json",
            str(summary_path),
        ],
    )
    assert demo.exit_code == 0, demo.output
    summary = json.loads(summary_path.read_text())
    knee = summary["capacity"]["knee"]["requests"]
    assert knee in (16, 32), summary["capacity"]
    config = tmp_path / "fast.yaml"
    config.write_text("for: {HeadroomConcurrencyNearKnee: 0s}\n")
    # 60x: each 5-second level fills the rules' 5-minute windows; concurrency is the same at any scale
    replay = CliRunner().invoke(
        main,
        ["alerts", "backtest", "--db", str(db), "--time-scale", "60", "--config", str(config), "--json", "-"],
    )
    assert replay.exit_code == 0, replay.output
    result = json.loads(replay.stdout)  # --json -: the JSON alone on stdout, the timeline on stderr
    start = datetime.fromisoformat(result["start"]["at"]).timestamp()
    fired = [
        a
        for a in result["alerts"]
        if a["alert"] == "HeadroomConcurrencyNearKnee"
        and a["firing"]
        and a["labels"]["caliber"] == "requests"
    ]
    assert fired, result["alerts"]
    first_wall = start + min(a["firing"]["offset_s"] for a in fired) / 60
    levels = {level["concurrency"]: level for level in summary["levels"]}
    crossing = min(c for c in levels if c >= DEFAULT.knee_warning_ratio * knee)
    assert datetime.fromisoformat(levels[crossing]["start"]).timestamp() <= first_wall
    assert first_wall <= datetime.fromisoformat(levels[max(levels)]["end"]).timestamp()
    assert "headroom_engine_requests_waiting" in result["missing_series"]


def test_backtest_command_line_errors_name_the_input(tmp_path):
    runner = CliRunner()
    unknown = runner.invoke(main, ["alerts", "backtest", "no-such-scenario"])
    assert unknown.exit_code == 2 and "no-such-scenario" in unknown.output and "ramp" in unknown.output
    both = runner.invoke(main, ["alerts", "backtest", "ramp", "--db", "x.duckdb"])
    assert both.exit_code == 2 and "not both" in both.output
    nothing = runner.invoke(main, ["alerts", "backtest"])
    assert nothing.exit_code == 2 and "--list" in nothing.output
    missing = runner.invoke(main, ["alerts", "backtest", "--db", str(tmp_path / "none.duckdb")])
    assert missing.exit_code == 1 and "none.duckdb" in missing.output
    listed = runner.invoke(main, ["alerts", "backtest", "--list"])
    assert listed.exit_code == 0 and listed.output.count("\n") >= 12 and "daily_spike" in listed.output


@pytest.mark.integration
def test_a_missed_expectation_exits_1_and_the_outputs_say_why(tmp_path):
    require_tool("prometheus")
    late = tmp_path / "late.yaml"
    late.write_text("for: {HeadroomEngineScrapeFailing: 30m}\n")
    picture = tmp_path / "down.png"
    result = CliRunner().invoke(
        main,
        [
            "alerts",
            "backtest",
            "engine_metrics_down",
            "--config",
            str(late),
            "--json",
            str(tmp_path / "down.json"),
            "--plot",
            str(picture),
        ],
    )
    assert result.exit_code == 1, result.output
    assert "FAIL  HeadroomEngineScrapeFailing fires within 5m: never fired" in result.output
    document = json.loads((tmp_path / "down.json").read_text())
    assert document["passed"] is False and document["scenario"] == "engine_metrics_down"
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
