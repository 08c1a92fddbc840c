"""A tiny notation for alert annotations that renders both to Go templates and to expected text.

`<model>` is a label, `<value>` the alert's value and `<value:humanizePercentage>` the value through
a Prometheus template function. The rules get Go templates; promtool tests get the text a human
expects, with the value written out by the test author (Prometheus does the formatting for real):

    to_go("KV at <value:humanizePercentage> on <model>")
        -> "KV at {{ $value | humanizePercentage }} on {{ $labels.model }}"
    to_text("KV at <value:humanizePercentage> on <model>", {"model": "m"}, "97%")
        -> "KV at 97% on m"

`<calibers:RECORD>` lists a per-caliber record for the alert's model (and the other `keys`
labels), read with the `query` template function when the annotation is rendered:

    to_go("needed: <calibers:model_caliber:x:ceil>")
        -> 'needed: {{ range $i, $s := printf "model_caliber:x:ceil{model=%q}" $labels.model | query
            | sortByLabel "caliber" }}{{ if $i }}, {{ end }}{{ $s.Labels.caliber }} ...{{ end }}'
    to_text("needed: <calibers:model_caliber:x:ceil>", labels, "", {"model_caliber:x:ceil": "requests 2"})
        -> "needed: requests 2"

Without a series (no pool published) it reads "unknown".
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

__all__ = ["to_go", "to_text", "UNKNOWN"]

_PLACEHOLDER = re.compile(r"<(?P<name>[a-z_]+)(?::(?P<function>[A-Za-z]+))?>")
_CALIBERS = re.compile(r"<calibers:(?P<record>[a-z_][a-z0-9_:]*)>")
UNKNOWN = "unknown"  # what <calibers:...> reads without a series


def _calibers(record: str, keys: Sequence[str]) -> str:
    matchers = ",".join(f"{key}=%q" for key in keys)
    args = " ".join(f"$labels.{key}" for key in keys)
    return (
        f'{{{{ range $i, $s := printf "{record}{{{matchers}}}" {args} | query | sortByLabel "caliber" }}}}'
        '{{ if $i }}, {{ end }}{{ $s.Labels.caliber }} {{ printf "%.0f" $s.Value }}'
        f"{{{{ else }}}}{UNKNOWN}{{{{ end }}}}"
    )


def to_go(text: str, keys: Sequence[str] = ("model",)) -> str:
    """Replace placeholders with Prometheus (Go) template actions; `keys`: <calibers:...>'s matchers."""
    text = _CALIBERS.sub(lambda match: _calibers(match["record"], keys), text)

    def replace(match: re.Match[str]) -> str:
        name, function = match["name"], match["function"]
        subject = "$value" if name == "value" else f"$labels.{name}"
        return f"{{{{ {subject} | {function} }}}}" if function else f"{{{{ {subject} }}}}"

    return _PLACEHOLDER.sub(replace, text)


def to_text(
    text: str, labels: dict[str, str], value_text: str = "", calibers: Mapping[str, str] | None = None
) -> str:
    """Replace placeholders with label values, the already-formatted value and `calibers` by record."""

    def listed(match: re.Match[str]) -> str:
        record = match["record"]
        if calibers is None or record not in calibers:
            raise KeyError(f"annotation lists {record} per caliber but the case gives no expected text")
        return calibers[record]

    text = _CALIBERS.sub(listed, text)

    def replace(match: re.Match[str]) -> str:
        name = match["name"]
        if name == "value":
            return value_text
        if name not in labels:
            raise KeyError(
                f"annotation uses label {name!r} but the expected alert has labels {sorted(labels)}"
            )
        return labels[name]

    return _PLACEHOLDER.sub(replace, text)
