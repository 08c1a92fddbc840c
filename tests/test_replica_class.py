"""Replica classes (#33 item 4): the sidecar's class, given or derived, its info series, and the
capacity gauges per (model, task class, replica class)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import httpx
import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry, generate_latest
from support.estimates import capacity_estimate
from support.promql import promql_expr_test
from support.waiting import patient
from test_sources_gpu import FakeNvml

from collector.capacity import DEFAULT_REPLICA_CLASS
from collector.cli import main
from collector.sidecar.config import SidecarConfig
from collector.sidecar.replica import ReplicaClass, derive_replica_class
from collector.sources.base import EngineSnapshot
from collector.sources.gpu import GpuCollector
from collector.store.capacity_gauges import CapacityGauges, check_replica_class


@pytest.mark.parametrize(
    ("gpus", "slots", "expected"),
    [
        (["NVIDIA H100 80GB HBM3"], 16, "nvidia-h100-80gb-hbm3-slots16"),
        (["NVIDIA L40S", "NVIDIA L40S"], None, "2x-nvidia-l40s"),
        ([], 4, "slots4"),
        ([], None, "default"),
        ([], 0, "default"),
    ],
)
def test_the_class_is_derived_from_the_gpus_and_the_slots(gpus, slots, expected):
    assert derive_replica_class(gpus, slots) == expected


@pytest.mark.parametrize("bad", ["", "has space", "-leading", "x" * 64, 'quote"'])
def test_a_bad_class_name_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="--replica-class"):
        check_replica_class(bad)
    with pytest.raises(ValueError, match="--replica-class"):
        SidecarConfig(upstream="http://127.0.0.1:8000", replica_class=bad or " ")


def test_headroom_run_refuses_a_bad_class_before_starting():
    result = CliRunner().invoke(main, ["run", "--upstream", "http://127.0.0.1:1", "--replica-class", "a b"])
    assert result.exit_code == 2 and "--replica-class 'a b' is not a class name" in result.output


def test_headroom_run_help_names_the_option_and_an_example():
    text = CliRunner().invoke(main, ["run", "--help"]).output
    assert "--replica-class" in text and "--replica-class l40s-tp1" in text


def _info(collector: ReplicaClass) -> str:
    registry = CollectorRegistry()
    registry.register(collector)
    return generate_latest(registry).decode()


def _engine(snapshot: EngineSnapshot) -> SimpleNamespace:
    return SimpleNamespace(latest=snapshot)


def test_undecided_until_the_engine_answers_then_fixed():
    engine = _engine(EngineSnapshot.down("auto", "not polled yet"))
    replica = ReplicaClass(None, gpu_names=lambda: ["NVIDIA L40S"], engine=engine)  # type: ignore[arg-type]
    assert replica.value is None and "headroom_replica_info{" not in _info(replica)
    engine.latest = EngineSnapshot("llamacpp", True, max_concurrency=8)
    assert replica.value == "nvidia-l40s-slots8"
    assert 'headroom_replica_info{replica_class="nvidia-l40s-slots8"} 1.0' in _info(replica)
    engine.latest = EngineSnapshot("llamacpp", True, max_concurrency=4)  # decided once: no flapping
    assert replica.value == "nvidia-l40s-slots8"


def test_a_ceiling_that_is_not_a_slot_count_is_not_part_of_the_class():
    engine = _engine(EngineSnapshot("vllm", True, max_concurrency=23))  # KV at the longest context
    assert ReplicaClass(None, engine=engine).value == DEFAULT_REPLICA_CLASS  # type: ignore[arg-type]


def test_the_given_class_wins_and_no_engine_decides_at_once():
    engine = _engine(EngineSnapshot("llamacpp", True, max_concurrency=8))
    assert ReplicaClass("h100-tp1", engine=engine).value == "h100-tp1"  # type: ignore[arg-type]
    assert ReplicaClass(None, gpu_names=lambda: ["NVIDIA A10G"]).value == "nvidia-a10g"


def test_the_gpu_collector_names_its_gpus_for_the_class(monkeypatch):
    FakeNvml().install(monkeypatch)
    assert GpuCollector().names() == ["NVIDIA H100 80GB HBM3", "NVIDIA A10G", "NVIDIA L4"]
    FakeNvml(count=0).install(monkeypatch)
    assert GpuCollector().names() == []


def test_capacity_gauges_carry_the_class_and_keep_two_classes_of_one_model_apart():
    gauges = CapacityGauges()
    gauges.replace(
        [
            capacity_estimate("m", replica_class="h100", knee_requests=16, recommended_pool=12),
            capacity_estimate("m", replica_class="l40s", knee_requests=8, recommended_pool=6),
        ]
    )
    assert gauges.get("m", replica_class="h100").knee_requests == 16  # type: ignore[union-attr]
    assert gauges.get("m", replica_class="l40s").knee_requests == 8  # type: ignore[union-attr]
    assert gauges.get("m") is None
    registry = CollectorRegistry()
    registry.register(gauges)
    labels = {"model": "m", "task_class": "all", "source": "probe", "confidence": "medium"}
    for cls, knee in (("h100", 16.0), ("l40s", 8.0)):
        value = registry.get_sample_value("headroom_capacity_knee_requests", labels | {"replica_class": cls})
        assert value == knee


@pytest.fixture
def two_classes(tmp_path):
    """One model measured on two replica classes: h100 (knee 16) and l40s (knee 8)."""
    from test_analysis_estimate import _estimate

    from collector.store.db import RequestStore
    from collector.store.estimates import save_estimate

    store = RequestStore(tmp_path / "fleet.duckdb")
    estimates = {}
    for cls, knee in (("h100", 16), ("l40s", 8)):
        # a probe run per class (one estimate per run: collector.store.estimates)
        estimate = replace(_estimate(model="m", knee_at=knee), replica_class=cls, run_id=f"probe-{cls}")
        save_estimate(store, estimate)
        estimates[cls] = estimate
    store.close()
    return tmp_path / "fleet.duckdb", estimates


def test_integrations_render_per_replica_class_and_ask_which_when_there_are_several(two_classes):
    import yaml

    db = str(two_classes[0])
    result = CliRunner().invoke(main, ["integrations", "keda", "--db", db, "--deployment", "d"])
    assert result.exit_code == 1 and "pass --replica-class" in result.output
    assert "m (replica class h100)" in result.output and "m (replica class l40s)" in result.output
    pools = {}
    for cls in ("h100", "l40s"):
        args = ["integrations", "keda", "--db", db, "--deployment", f"m-{cls}", "--replica-class", cls]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        scaled = yaml.safe_load(result.output)
        assert scaled["metadata"]["annotations"]["llm-headroom/replica-class"] == cls
        requests = scaled["spec"]["triggers"][0]["metadata"]["query"]
        assert f'headroom_replica_info{{replica_class="{cls}"}}' in requests
        assert f'replica_class="{cls}"' in requests.split("headroom_capacity_recommended_pool_requests")[1]
        pools[cls] = int(scaled["metadata"]["annotations"]["llm-headroom/pool-requests"])
        gateway = CliRunner().invoke(main, ["integrations", "gateway", "--db", db, "--replica-class", cls])
        assert gateway.exit_code == 0 and f"maxConcurrency: {pools[cls]}" in gateway.output
        llmd = CliRunner().invoke(main, ["integrations", "llm-d", "--db", db, "--replica-class", cls])
        assert llmd.exit_code == 0 and f"m-{cls}:" in llmd.output
    assert pools["h100"] > pools["l40s"]
    missing = CliRunner().invoke(
        main, ["integrations", "keda", "--db", db, "--deployment", "d", "--replica-class", "a10g"]
    )
    assert missing.exit_code == 1 and "no published estimates match" in missing.output


@pytest.mark.integration
def test_keda_per_class_counts_only_that_class_s_sidecars_in_promtool(two_classes, tmp_path):
    """Sidecar a (h100) carries 10 requests, b (l40s) 3; pools 12 and 6 published per class: the
    l40s ScaledObject reads 3 / 6 = 0.5 and the h100 one 10 / 12, each ignoring the other class."""
    from conftest import require_tool

    from collector.integrations.render import keda_scaled_object
    from collector.rules.config import DEFAULT

    promtool = require_tool("promtool")
    _, estimates = two_classes
    inputs = []
    for instance, cls, inflight, pool in (("a", "h100", 10, 12), ("b", "l40s", 3, 6)):
        where = f'job="{DEFAULT.sidecar_job}",model="m",instance="{instance}",tenant="t"'
        inputs += [
            {"series": f"headroom_inflight_requests{{{where}}}", "values": f"{inflight}+0x5"},
            {
                "series": f'headroom_replica_info{{instance="{instance}",replica_class="{cls}"}}',
                "values": "1+0x5",
            },
            {
                "series": f'headroom_capacity_recommended_pool_requests{{model="m",task_class="all",'
                f'replica_class="{cls}",instance="store"}}',
                "values": f"{pool}+0x5",
            },
        ]
    checks = []
    for cls, value in (("h100", round(10 / 12, 6)), ("l40s", 0.5)):
        query = keda_scaled_object(estimates[cls], deployment="d")["spec"]["triggers"][0]["metadata"]["query"]
        checks.append(
            {
                "expr": f"round({query}, 0.000001)",
                "eval_time": "4m",
                "exp_samples": [{"labels": "{}", "value": value}],
            }
        )
    result = promql_expr_test(promtool, tmp_path, inputs, checks)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_probe_takes_the_class_of_the_sidecar_it_probes_through(tmp_path):
    from support.sidecar import sidecar_rig

    from collector.analysis.cli import sidecar_replica_class

    with sidecar_rig(tmp_path, replica_class="l40s-tp1") as rig:
        assert sidecar_replica_class(rig.url) == "l40s-tp1"
        assert sidecar_replica_class(rig.url + "/v1") == "l40s-tp1"
        assert sidecar_replica_class(rig.upstream.url) == DEFAULT_REPLICA_CLASS  # the engine itself
    assert sidecar_replica_class("http://127.0.0.1:1") == DEFAULT_REPLICA_CLASS  # nobody answers
    result = CliRunner().invoke(main, ["probe", "--url", "http://127.0.0.1:1", "--replica-class", "a b"])
    assert result.exit_code == 2 and "is not a class name" in result.output


def test_each_row_carries_the_class_of_the_sidecar_that_served_it(tmp_path):
    from support.sidecar import sidecar_rig

    with sidecar_rig(tmp_path, replica_class="l40s-tp1") as rig:
        answer = httpx.post(
            rig.url + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True},
            timeout=patient(10),
        )
        assert answer.status_code == 200
        (row,) = rig.rows()
    assert row["replica_class"] == "l40s-tp1"


def test_the_rules_default_class_is_the_store_s():
    from collector.alerts import recording

    assert recording.DEFAULT_REPLICA_CLASS == DEFAULT_REPLICA_CLASS
