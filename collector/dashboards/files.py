"""The generated dashboard files, by name: what `headroom dashboards generate` writes.

dashboard_files(DEFAULT) -> {"headroom-capacity-overview.json": "{...}", ...}
"""

from __future__ import annotations

from collector.dashboards.boards import dashboards
from collector.rules.config import DEFAULT, RulesConfig
from collector.rules.render import render_json

__all__ = ["dashboard_files"]


def dashboard_files(config: RulesConfig = DEFAULT) -> dict[str, str]:
    """Grafana dashboard JSON by file name."""
    return {f"{board['uid']}.json": render_json(board) for board in dashboards(config)}
