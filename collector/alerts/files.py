"""The generated alert files, by name: what `headroom alerts generate` writes.

    alert_files(DEFAULT) -> {"headroom-recording.rules.yaml": "...", "headroom-alerts.rules.yaml": ...,
                             "headroom.test.yaml": ..., "alertmanager.yml": ...}

Rule files end in `.rules.yaml` so a Prometheus `rule_files: [.../*.rules.yaml]` glob never picks
up the promtool test file beside them.
"""

from __future__ import annotations

from collector.alerts.alerting import alerting_groups
from collector.alerts.alertmanager import (
    PRODUCTION_RECEIVERS,
    RECEIVER_EXAMPLE,
    Receivers,
    alertmanager_config,
)
from collector.alerts.promtool_tests import unit_test_document
from collector.alerts.recording import recording_groups
from collector.alerts.recording_tests import recording_test_groups
from collector.rules.config import DEFAULT, RulesConfig
from collector.rules.render import render_yaml

__all__ = ["RECORDING_FILE", "ALERTS_FILE", "TEST_FILE", "ALERTMANAGER_FILE", "rule_files", "alert_files"]

RECORDING_FILE = "headroom-recording.rules.yaml"
ALERTS_FILE = "headroom-alerts.rules.yaml"
TEST_FILE = "headroom.test.yaml"
ALERTMANAGER_FILE = "alertmanager.yml"
_ALERTS_COMMAND = "alerts generate"


def rule_files(config: RulesConfig = DEFAULT) -> dict[str, str]:
    """Only the Prometheus rule files (what a Prometheus loads), rendered under `config`."""
    config.validate()
    return {
        RECORDING_FILE: render_yaml({"groups": recording_groups(config)}, _ALERTS_COMMAND),
        ALERTS_FILE: render_yaml({"groups": alerting_groups(config)}, _ALERTS_COMMAND),
    }


def alert_files(config: RulesConfig = DEFAULT, receivers: Receivers = PRODUCTION_RECEIVERS) -> dict[str, str]:
    """Rule files, their promtool tests and the Alertmanager configuration (with a receiver example)."""
    tests = unit_test_document(config, [RECORDING_FILE, ALERTS_FILE], recording_test_groups(config))
    manager = render_yaml(
        alertmanager_config(receivers, config.receivers, config.cluster_label), _ALERTS_COMMAND
    )
    return rule_files(config) | {
        TEST_FILE: render_yaml(tests, _ALERTS_COMMAND),
        ALERTMANAGER_FILE: manager + "\n" + RECEIVER_EXAMPLE,
    }
