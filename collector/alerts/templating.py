"""A tiny notation for alert annotations that renders both to Go templates and to expected text.

`<model>` is a label, `<value>` the alert's value and `<value:humanizePercentage>` the value through
a Prometheus template function. The rules get Go templates; promtool tests get the text a human
expects, with the value written out by the test author (Prometheus does the formatting for real):

    to_go("KV at <value:humanizePercentage> on <model>")
        -> "KV at {{ $value | humanizePercentage }} on {{ $labels.model }}"
    to_text("KV at <value:humanizePercentage> on <model>", {"model": "m"}, "97%")
        -> "KV at 97% on m"
"""

from __future__ import annotations

import re

__all__ = ["to_go", "to_text"]

_PLACEHOLDER = re.compile(r"<(?P<name>[a-z_]+)(?::(?P<function>[A-Za-z]+))?>")


def to_go(text: str) -> str:
    """Replace placeholders with Prometheus (Go) template actions."""

    def replace(match: re.Match) -> str:
        name, function = match["name"], match["function"]
        subject = "$value" if name == "value" else f"$labels.{name}"
        return f"{{{{ {subject} | {function} }}}}" if function else f"{{{{ {subject} }}}}"

    return _PLACEHOLDER.sub(replace, text)


def to_text(text: str, labels: dict[str, str], value_text: str = "") -> str:
    """Replace placeholders with label values and the already-formatted value."""

    def replace(match: re.Match) -> str:
        name = match["name"]
        if name == "value":
            return value_text
        if name not in labels:
            raise KeyError(
                f"annotation uses label {name!r} but the expected alert has labels {sorted(labels)}"
            )
        return labels[name]

    return _PLACEHOLDER.sub(replace, text)
