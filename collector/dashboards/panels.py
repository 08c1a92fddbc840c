"""Small builders for Grafana dashboard JSON: targets, panels, variables and a two-column layout.

Every panel gets a unit and a description (how to read it); every target reads the `$datasource`
variable. Builders return plain dicts; `layout` numbers them and places them on the grid.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "PROMETHEUS_UID",
    "DATASOURCE",
    "target",
    "panel",
    "timeseries",
    "table",
    "stat",
    "thresholds",
    "right_axis",
    "dashed",
    "query_variable",
    "datasource_variable",
    "layout",
    "alert_annotation",
    "dashboard_links",
]

# Fixed uid of the provisioned Prometheus datasource (deploy/grafana/provisioning/datasources).
PROMETHEUS_UID = "headroom-prometheus"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

Json = dict[str, Any]  # a fragment of Grafana's dashboard JSON: open-ended by design


def target(expr: str, legend: str, ref: str = "A", *, instant: bool = False, table: bool = False) -> Json:
    """One Prometheus query of a panel; `table` asks Grafana for one row per series (format: table)."""
    query = {
        "datasource": DATASOURCE,
        "expr": expr,
        "legendFormat": legend,
        "refId": ref,
        "instant": instant,
        "range": not instant,
    }
    return query | ({"format": "table"} if table else {})


def thresholds(*steps: tuple[float, str], style: str = "line") -> Json:
    """fieldConfig.defaults fragment: coloured thresholds drawn as `style` (line, dashed, off)."""
    return {
        "thresholds": {
            "mode": "absolute",
            "steps": [{"color": "green", "value": None}]
            + [{"color": color, "value": value} for value, color in steps],
        },
        "custom": {"thresholdsStyle": {"mode": style}},
    }


def _by_query(ref: str) -> Json:
    """Override matcher by query (refId), never by display name: a series' name is user data
    (a sidecar called `gpu-pool-1` must not turn every line dashed)."""
    return {"id": "byFrameRefID", "options": ref}


def right_axis(ref: str, unit: str, label: str) -> Json:
    """Override: the series of query `ref` use the right axis with `unit`."""
    return {
        "matcher": _by_query(ref),
        "properties": [
            {"id": "custom.axisPlacement", "value": "right"},
            {"id": "unit", "value": unit},
            {"id": "custom.axisLabel", "value": label},
        ],
    }


def dashed(*refs: str) -> tuple[Json, ...]:
    """Overrides: the reference lines (knee, pool, ceiling) of queries `refs` drawn dashed."""
    return tuple(
        {
            "matcher": _by_query(ref),
            "properties": [{"id": "custom.lineStyle", "value": {"dash": [10, 10], "fill": "dash"}}],
        }
        for ref in refs
    )


def panel(
    kind: str,
    title: str,
    description: str,
    targets: list[Json],
    unit: str,
    *,
    defaults: Json | None = None,
    overrides: tuple[Json, ...] = (),
    options: Json | None = None,
    **extra: Any,
) -> Json:
    """A panel of type `kind`; `defaults` merges into fieldConfig.defaults (custom merged too)."""
    field_defaults: Json = {"unit": unit, "custom": {}}
    for key, value in (defaults or {}).items():
        field_defaults[key] = {**field_defaults.get(key, {}), **value} if key == "custom" else value
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": targets,
        "fieldConfig": {"defaults": field_defaults, "overrides": list(overrides)},
        "options": options or {},
        **extra,
    }


def timeseries(
    title: str,
    description: str,
    targets: list[Json],
    unit: str,
    *,
    axis_label: str = "",
    stack: bool = False,
    **kwargs: Any,
) -> Json:
    """A time-series panel; `axis_label` names the left axis (e.g. "requests")."""
    custom = {
        "axisLabel": axis_label,
        "drawStyle": "line",
        "fillOpacity": 10 if stack else 0,
        "stacking": {"mode": "normal" if stack else "none", "group": "A"},
    }
    defaults = kwargs.pop("defaults", {})
    defaults["custom"] = {**custom, **defaults.get("custom", {})}
    options = {
        "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]},
        "tooltip": {"mode": "multi", "sort": "desc"},
    }
    return panel(
        "timeseries", title, description, targets, unit, defaults=defaults, options=options, **kwargs
    )


def table(title: str, description: str, targets: list[Json], unit: str, **kwargs: Any) -> Json:
    """A table of instant queries, one row per series: every target asks for `format: table`."""
    rows = [t | {"format": "table", "instant": True, "range": False} for t in targets]
    return panel(
        "table",
        title,
        description,
        rows,
        unit,
        options={"showHeader": True, "sortBy": [{"displayName": "Value", "desc": True}]},
        transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True}}}],
        **kwargs,
    )


def stat(
    title: str,
    description: str,
    targets: list[Json],
    unit: str,
    *,
    decimals: int | None = None,
    **kwargs: Any,
) -> Json:
    """A single-number panel for the top row: the latest value, coloured by its thresholds."""
    defaults = kwargs.pop("defaults", {}) | ({"decimals": decimals} if decimals is not None else {})
    options = {
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "colorMode": "background",
        "graphMode": "none",
        "textMode": "value_and_name",
        "justifyMode": "auto",
        "orientation": "auto",
    }
    return panel(
        "stat",
        title,
        description,
        targets,
        unit,
        defaults=defaults,
        options=options,
        width=4,
        height=4,
        **kwargs,
    )


def datasource_variable() -> Json:
    """`$datasource`: any Prometheus, defaulting to the provisioned one."""
    return {
        "type": "datasource",
        "name": "datasource",
        "label": "Datasource",
        "query": "prometheus",
        "current": {"text": "Prometheus", "value": PROMETHEUS_UID},
        "hide": 0,
        "refresh": 1,
    }


def query_variable(name: str, label: str, query: str) -> Json:
    """A multi-value label variable with All = `.*` (so an absent label still matches)."""
    return {
        "type": "query",
        "name": name,
        "label": label,
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": f"{name}-values"},
        "definition": query,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "refresh": 2,
        "sort": 1,
        "current": {"text": ["All"], "value": ["$__all"]},
        "hide": 0,
    }


def layout(panels: list[Json], width: int = 12, height: int = 8) -> list[Json]:
    """Number panels from 1 and place them left to right, rows as tall as their tallest panel.

    A panel with "full": True takes a row; stat panels carry their own "width"/"height" (4 x 4).
    """
    placed, x, y, row_height = [], 0, 0, 0
    for number, original in enumerate(panels, start=1):
        item = dict(original)
        w = 24 if item.pop("full", False) else item.pop("width", width)
        h = item.pop("height", height)
        if x + w > 24:
            x, y, row_height = 0, y + row_height, 0
        placed.append({**item, "id": number, "gridPos": {"h": h, "w": w, "x": x, "y": y}})
        x, row_height = x + w, max(row_height, h)
        if x >= 24:
            x, y, row_height = 0, y + row_height, 0
    return placed


def alert_annotation(expr: str) -> Json:
    """Grafana annotation: a marker wherever a Headroom alert fired (from Prometheus' ALERTS series)."""
    return {
        "datasource": DATASOURCE,
        "enable": True,
        "expr": expr,
        "name": "Headroom alerts",
        "iconColor": "red",
        "step": "60s",
        "titleFormat": "{{alertname}}",
        "textFormat": "{{severity}} on {{model}}",
        "tagKeys": "severity,model",
        "useValueForTime": False,
    }


def dashboard_links(runbooks_url: str) -> list[Json]:
    """Links on every dashboard: the other llm-headroom dashboards (variables and time kept), runbooks."""
    return [
        {
            "type": "dashboards",
            "tags": ["llm-headroom"],
            "asDropdown": False,
            "includeVars": True,
            "keepTime": True,
            "title": "llm-headroom",
            "icon": "external link",
            "targetBlank": False,
        },
        {
            "type": "link",
            "title": "Runbooks",
            "url": runbooks_url,
            "icon": "doc",
            "targetBlank": True,
            "includeVars": False,
            "keepTime": False,
            "tags": [],
        },
    ]
