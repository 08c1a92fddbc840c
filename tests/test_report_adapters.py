"""The weekly review's LoRA adapters (#39 item 2): per base model, each adapter's requests, TTFT
p50/p95, output tokens/s and share of the base model's request-seconds, from known rows of the
request log; probe rows left out; shown in JSON, Markdown and HTML."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import orjson
import pytest
from support.synthetic import synthetic_rows

from collector.report.build import build_report
from collector.report.collect import collect_inputs
from collector.report.render_html import render_html
from collector.report.render_json import render_json
from collector.report.render_md import render_md
from collector.store.db import RequestStore

WEEK = timedelta(days=7)
SINCE = datetime(2026, 11, 23, tzinfo=UTC)
# (model, adapter, ttft_s, e2e_s, completion tokens): request-seconds 6.6 (sql) + 2.5 (chat) +
# 0.9 (the base model's own) = 10.0
KNOWN = [
    ("base", "sql", 0.1, 1.1, 10),
    ("base", "sql", 0.2, 2.2, 20),
    ("base", "sql", 0.3, 3.3, 30),
    ("base", "chat", 0.5, 2.5, 40),
    ("base", None, 0.05, 0.45, 8),
    ("base", None, 0.05, 0.45, 8),
    ("plain", None, 0.1, 1.0, 5),
]


def _rows() -> list[dict]:
    template = synthetic_rows(len(KNOWN) + 1, SINCE + timedelta(hours=1), span=timedelta(minutes=10))
    rows = [
        dict(
            row, model=model, adapter=adapter, ttft_s=ttft, e2e_s=e2e, completion_tokens=tokens, outcome="ok"
        )
        for row, (model, adapter, ttft, e2e, tokens) in zip(template, KNOWN)
    ]
    # a probe request on an adapter, longer than all the rest: the review is about traffic
    probe = dict(template[-1], model="base", adapter="chat", source="probe", ttft_s=9.0, e2e_s=99.0)
    return rows + [probe]


def test_per_adapter_figures_from_known_rows_and_rendered_everywhere():
    store = RequestStore()
    try:
        store.insert_rows(_rows())
        report = build_report(collect_inputs(store, SINCE, SINCE + WEEK))
    finally:
        store.close()
    models = {m["model"]: m for m in report["models"]}
    assert models["plain"]["adapters"] == []  # no adapter traffic: no section
    got = {e["adapter"]: e for e in models["base"]["adapters"]}
    assert [e["adapter"] for e in models["base"]["adapters"]] == ["sql", "chat", None]  # by share
    expected = {
        # requests, TTFT p50, p95 (linear, as DuckDB's quantile_cont), tokens / (e2e - TTFT), share
        "sql": (3, 0.2, 0.29, 60 / 6.0, 0.66),
        "chat": (1, 0.5, 0.5, 40 / 2.0, 0.25),  # the probe row on chat is not counted
        None: (2, 0.05, 0.05, 16 / 0.8, 0.09),
    }
    for adapter, (requests, p50, p95, rate, share) in expected.items():
        entry = got[adapter]
        assert entry["requests"] == requests
        assert (entry["ttft_p50_s"], entry["ttft_p95_s"]) == pytest.approx((p50, p95))
        assert entry["output_tokens_per_s"] == pytest.approx(rate)
        assert entry["capacity_share"] == pytest.approx(share)
    assert sum(e["capacity_share"] for e in got.values()) == pytest.approx(1.0)

    assert orjson.loads(render_json(report))["models"][0]["adapters"][0]["adapter"] == "sql"
    text = render_md(report)
    assert (
        "| LoRA adapter | requests | p50 TTFT (s) | p95 TTFT (s) | output tokens/s | share of capacity |"
        in text
    )
    assert "| sql | 3 | 0.200 | 0.290 | 10 | 66.0 % |" in text
    assert "| (base model) | 2 |" in text
    assert text.count("| LoRA adapter |") == 1  # only the model with adapters has the table
    html = render_html(report)
    assert "<th>LoRA adapter</th>" in html and "<td>66.0 %</td>" in html
