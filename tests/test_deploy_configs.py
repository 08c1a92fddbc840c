"""The deployed Prometheus and Alertmanager configurations pass the real promtool and amtool."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import require_tool
from support.waiting import patient

ROOT = Path(__file__).resolve().parent.parent
PROMETHEUS_YML = ROOT / "deploy/prometheus/prometheus.yml"
ALERTMANAGER_YML = ROOT / "alerts/alertmanager.yml"

pytestmark = pytest.mark.integration


def _mounted_layout(tmp_path: Path) -> Path:
    """The container's /etc/prometheus: prometheus.yml with alerts/ beside it, as compose mounts them."""
    shutil.copy(PROMETHEUS_YML, tmp_path / "prometheus.yml")
    (tmp_path / "alerts").symlink_to(ROOT / "alerts", target_is_directory=True)
    return tmp_path / "prometheus.yml"


def test_promtool_check_config_passes_with_the_generated_rules(tmp_path):
    promtool = require_tool("promtool")
    assert (ROOT / "alerts").is_dir(), "alerts/ is missing: run `headroom alerts generate`"
    config = _mounted_layout(tmp_path)
    result = subprocess.run(
        [promtool, "check", "config", str(config)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=patient(60),
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    found = re.search(r"SUCCESS: (\d+) rule files found", output)
    assert found and int(found.group(1)) >= 1, f"no rule file was loaded:\n{output}"
    assert "FAILED" not in output


def test_promtool_rejects_the_config_when_a_rule_file_is_broken(tmp_path):
    """The check above is real: the same layout with a broken rule file fails."""
    promtool = require_tool("promtool")
    shutil.copy(PROMETHEUS_YML, tmp_path / "prometheus.yml")
    (tmp_path / "alerts").mkdir()
    pattern = yaml.safe_load(PROMETHEUS_YML.read_text())["rule_files"][0]
    broken = tmp_path / pattern.replace("*", "broken")
    broken.write_text("groups:\n  - name: x\n    rules:\n      - alert: Bad\n        expr: rate(\n")
    result = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=patient(60),
    )
    assert result.returncode != 0


def test_amtool_check_config_passes_for_the_mounted_alertmanager_config():
    amtool = require_tool("amtool")
    assert ALERTMANAGER_YML.is_file(), (
        "alerts/alertmanager.yml is missing: docker-compose.yml mounts it into Alertmanager; "
        "generate it with `headroom alerts generate`"
    )
    result = subprocess.run(
        [amtool, "check-config", str(ALERTMANAGER_YML)], capture_output=True, text=True, timeout=patient(60)
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
