"""Rendering the review: self-contained HTML with a real PNG, Markdown, JSON; `headroom report` both ways."""

from __future__ import annotations

import base64
import io
import re
from datetime import timedelta

import orjson
import pytest
from click.testing import CliRunner
from PIL import Image

from collector.cli import main
from collector.report.review import build_from_store, render_report
from collector.service.app import create_store_app
from collector.serving import serve_in_thread
from collector.store.db import RequestStore
from collector.store.synthetic import synthetic_rows
from collector.timewin import utc_now


@pytest.fixture(scope="module")
def db_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("report") / "h.duckdb"
    store = RequestStore(path)
    now = utc_now()
    store.insert_rows(
        synthetic_rows(
            400, now - timedelta(days=13), span=timedelta(days=6), prefix="old", models=("model-a", "model-b")
        )
    )
    store.insert_rows(
        synthetic_rows(
            400,
            now - timedelta(days=6),
            span=timedelta(days=5),
            prefix="new",
            models=("model-a", "model-b"),
            ttft_scale=2.0,
        )
    )
    store.close()
    return path


@pytest.fixture(scope="module")
def report(db_path):
    store = RequestStore(db_path, read_only=True)
    try:
        return build_from_store(store, "7d", slo_ttft_p95_s=0.5)
    finally:
        store.close()


def test_html_is_self_contained_with_a_decodable_plot_per_model(report):
    html = render_report(report, "html")
    assert not re.search(r"(src|href)=[\"']?(https?:)?//", html), "HTML must not load anything from outside"
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert len(images) == 2
    with Image.open(io.BytesIO(base64.b64decode(images[0]))) as picture:
        assert picture.format == "PNG" and picture.size[0] > 300
    assert "model-a" in html and "Recommended actions" in html and "Little" in html


def test_markdown_and_json_carry_the_same_figures(report):
    md = render_report(report, "md")
    data = orjson.loads(render_report(report, "json"))
    assert data == orjson.loads(orjson.dumps(report))
    first = data["models"][0]
    assert f"| requests (vs previous) | {first['traffic']['requests']:,}" in md
    assert f"{first['latency']['ttft_s']['p95']:.3f}" in md
    assert md.count("## model-") == 2 and "p95 TTFT rose" in md


def test_report_cli_from_db_and_from_a_store_url(db_path, report, tmp_path):
    runner = CliRunner()
    result = runner.invoke(
        main, ["report", "--db", str(db_path), "--since", "7d", "--format", "json", "--slo-ttft-p95", "0.5"]
    )
    assert result.exit_code == 0, result.output
    from_db = orjson.loads(result.stdout)
    assert [m["traffic"]["requests"] for m in from_db["models"]] == [
        m["traffic"]["requests"] for m in report["models"]
    ]
    store = RequestStore(db_path)
    server = serve_in_thread(create_store_app(store, "tok"))
    try:
        out = tmp_path / "review.html"
        result = runner.invoke(
            main,
            ["report", "--store-url", server.url, "--token", "tok", "--format", "html", "--out", str(out)],
        )
        assert result.exit_code == 0, result.output
        assert out.read_text().startswith("<!doctype html>") and "model-b" in out.read_text()
        refused = runner.invoke(main, ["report", "--store-url", server.url, "--token", "bad"])
        assert refused.exit_code != 0 and "refused the token" in refused.output
    finally:
        server.stop()
        store.close()


def test_report_cli_names_bad_input():
    runner = CliRunner()
    assert "give exactly one of --db" in runner.invoke(main, ["report"]).output
    assert (
        "'7 days' is not a duration"
        in runner.invoke(main, ["report", "--db", "x", "--since", "7 days"]).output
    )
    assert "does not exist" in runner.invoke(main, ["report", "--db", "/nonexistent/h.duckdb"]).output
