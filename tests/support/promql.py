"""PromQL expressions checked by promtool on given input series, with no rules of our own.

promql_expr_test(promtool, tmp_path, inputs, checks)
    inputs: [{"series": 'up{job="x"}', "values": "1+0x10"}, ...]
    checks: [{"expr": "...", "eval_time": "4m", "exp_samples": [{"labels": "{}", "value": 1}]}]
    -> promtool's CompletedProcess (returncode 0 when every expression gave what it expected)
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from support.waiting import patient


def promql_expr_test(
    promtool: str, directory: Path, inputs: list[dict[str, Any]], checks: list[dict[str, Any]]
) -> subprocess.CompletedProcess[str]:
    """Write one promtool test group (1-minute interval) of `inputs` and `checks` into `directory`
    beside an empty rule file, and run `promtool test rules` on it."""
    (directory / "rules.yaml").write_text("groups: []\n")
    document = {
        "rule_files": ["rules.yaml"],
        "tests": [{"interval": "1m", "input_series": inputs, "promql_expr_test": checks}],
    }
    (directory / "expr.test.yaml").write_text(yaml.safe_dump(document))
    return subprocess.run(
        [promtool, "test", "rules", "expr.test.yaml"],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=patient(60),
    )
