"""Capacity per task type: `headroom probe --workload` measures one gradient per class and
reports a knee and pool for each; on a KV-bound simulator the long class's knee is where the
simulator's own model puts it, below the short class's, and each class is published under its
own task_class label."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime

import pytest
from support.processes import HEADROOM, sim_process
from support.waiting import patient

from collector.analysis.workload import DEFAULT_WORKLOAD, load_workload
from collector.sim.cost import predicted_knee
from collector.store.capacity_gauges import CapacityGauges
from collector.store.db import RequestStore
from collector.store.decision import publish

WORKLOAD = """classes:
  - name: short
    max_tokens: 16
  - name: long
    max_tokens: 220
"""


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.serial  # a real-time simulator: throughput per level is this machine's to give
def test_two_classes_get_their_own_knees_where_the_kv_model_puts_them(tmp_path):
    (tmp_path / "workload.yaml").write_text(WORKLOAD)
    db = tmp_path / "probe.duckdb"
    with sim_process(speed=4, max_num_seqs=4, kv_cache_tokens=512, seed=7) as sim:
        done = subprocess.run(
            [
                str(HEADROOM),
                "probe",
                "--url",
                sim,
                "--levels",
                "1,2,4,8",
                "--max-samples",
                "24",
                "--max-level-seconds",
                "15",
                "--workload",
                str(tmp_path / "workload.yaml"),
                "--json",
                str(tmp_path / "knees.json"),
                "--db",
                str(db),
            ],
            capture_output=True,
            text=True,
            timeout=patient(300),
        )
    assert done.returncode == 0, done.stdout + done.stderr
    classes = json.loads((tmp_path / "knees.json").read_text())["classes"]
    store = RequestStore(db)
    try:
        rows = {
            task: store.query(
                "SELECT max(prompt_tokens), max(max_tokens) FROM requests WHERE task_class = ?", [task]
            )[0]
            for task in ("short", "long")
        }
        predicted = {
            task: predicted_knee(4, 512, 16, prompt_tokens, output)
            for task, (prompt_tokens, output) in rows.items()
        }
        assert predicted["long"] < predicted["short"] == 4
        assert {task: classes[task]["knee"]["requests"] for task in classes} == {
            task: max(level for level in (1, 2, 4, 8) if level <= knee) for task, knee in predicted.items()
        }
        gauges = CapacityGauges()
        decisions = publish(store, gauges, datetime.now(UTC))
        assert {(d.task_class, d.knee_requests) for d in decisions} == {
            ("short", classes["short"]["knee"]["requests"]),
            ("long", classes["long"]["knee"]["requests"]),
        }
        assert gauges.get("headroom-sim", "long").knee_requests == classes["long"]["knee"]["requests"]
    finally:
        store.close()
    assert "task class   knee   pool   knee / short" in done.stdout


def test_workload_file_errors_name_the_fault(tmp_path):
    assert load_workload("classes") == DEFAULT_WORKLOAD
    bad = tmp_path / "bad.yaml"
    for text, message in (
        ("classes: []", "expected a 'classes:' list"),
        ("classes:\n  - name: Short\n    max_tokens: 5", "must be lowercase"),
        ("classes:\n  - name: s\n    max_tokens: 0", "positive integer"),
        ("classes:\n  - name: s\n    max_tokens: 5\n    colour: red", "unknown keys"),
        ("classes:\n  - {name: s, max_tokens: 5}\n  - {name: s, max_tokens: 9}", "names repeat"),
    ):
        bad.write_text(text)
        with pytest.raises(ValueError, match=message):
            load_workload(str(bad))
    with pytest.raises(ValueError, match="cannot read"):
        load_workload(str(tmp_path / "missing.yaml"))
