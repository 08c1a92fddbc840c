"""Small builders for Grafana dashboard JSON: targets, panels, variables and a two-column layout.

Every panel gets a unit and a description (how to read it); every target reads the `$datasource`
variable. Builders return plain dicts; `layout` numbers them and places them on the grid.
"""

from __future__ import annotations

__all__ = [
    "PROMETHEUS_UID",
    "DATASOURCE",
    "target",
    "panel",
    "timeseries",
    "table",
    "thresholds",
    "right_axis",
    "dashed",
    "query_variable",
    "datasource_variable",
    "layout",
    "selector",
]

# Fixed uid of the provisioned Prometheus datasource (deploy/grafana/provisioning/datasources).
PROMETHEUS_UID = "headroom-prometheus"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

_FILTERS = {"model": 'model=~"$model"', "instance": 'instance=~"$instance"', "tenant": 'tenant=~"$tenant"'}


def selector(*filters: str, extra: str = "") -> str:
    """A label selector from dashboard variables: selector("model", "instance") ->
    '{model=~"$model", instance=~"$instance"}'; `extra` adds literal matchers."""
    matchers = [_FILTERS[name] for name in filters] + ([extra] if extra else [])
    return "{" + ", ".join(matchers) + "}"


def target(expr: str, legend: str, ref: str = "A", *, instant: bool = False) -> dict:
    """One Prometheus query of a panel."""
    return {
        "datasource": DATASOURCE,
        "expr": expr,
        "legendFormat": legend,
        "refId": ref,
        "instant": instant,
        "range": not instant,
    }


def thresholds(*steps: tuple[float, str], style: str = "line") -> dict:
    """fieldConfig.defaults fragment: coloured thresholds drawn as `style` (line, dashed, off)."""
    return {
        "thresholds": {
            "mode": "absolute",
            "steps": [{"color": "green", "value": None}]
            + [{"color": color, "value": value} for value, color in steps],
        },
        "custom": {"thresholdsStyle": {"mode": style}},
    }


def right_axis(pattern: str, unit: str, label: str) -> dict:
    """Override: series whose name matches regex `pattern` use the right axis with `unit`."""
    return {
        "matcher": {"id": "byRegexp", "options": pattern},
        "properties": [
            {"id": "custom.axisPlacement", "value": "right"},
            {"id": "unit", "value": unit},
            {"id": "custom.axisLabel", "value": label},
        ],
    }


def dashed(pattern: str) -> dict:
    """Override: reference lines (knee, pool) drawn dashed."""
    return {
        "matcher": {"id": "byRegexp", "options": pattern},
        "properties": [{"id": "custom.lineStyle", "value": {"dash": [10, 10], "fill": "dash"}}],
    }


def panel(
    kind: str,
    title: str,
    description: str,
    targets: list[dict],
    unit: str,
    *,
    defaults: dict | None = None,
    overrides: tuple[dict, ...] = (),
    options: dict | None = None,
    **extra,
) -> dict:
    """A panel of type `kind`; `defaults` merges into fieldConfig.defaults (custom merged too)."""
    field_defaults = {"unit": unit, "custom": {}}
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
    targets: list[dict],
    unit: str,
    *,
    axis_label: str = "",
    stack: bool = False,
    **kwargs,
) -> dict:
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


def table(title: str, description: str, targets: list[dict], unit: str, **kwargs) -> dict:
    """A table of instant queries (one row per series)."""
    return panel(
        "table",
        title,
        description,
        targets,
        unit,
        options={"showHeader": True, "sortBy": [{"displayName": "Value", "desc": True}]},
        transformations=[{"id": "labelsToFields", "options": {}}],
        **kwargs,
    )


def datasource_variable() -> dict:
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


def query_variable(name: str, label: str, query: str) -> dict:
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


def layout(panels: list[dict], width: int = 12, height: int = 8) -> list[dict]:
    """Number panels from 1 and place them two per row (a panel with "full": True takes a row)."""
    placed, x, y = [], 0, 0
    for number, original in enumerate(panels, start=1):
        item = dict(original)
        w = 24 if item.pop("full", False) else width
        if x + w > 24:
            x, y = 0, y + height
        placed.append({**item, "id": number, "gridPos": {"h": height, "w": w, "x": x, "y": y}})
        x += w
        if x >= 24:
            x, y = 0, y + height
    return placed
