"""Rendering the review: self-contained HTML with a real PNG, Markdown, JSON; `headroom report` both ways."""

from __future__ import annotations

import base64
import io
import re
from datetime import UTC, datetime, timedelta

import orjson
import pytest
from click.testing import CliRunner
from PIL import Image
from support.synthetic import synthetic_rows

from collector.cli import main
from collector.report.review import build_from_store, render_report
from collector.store.db import RequestStore
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
    assert len(images) == 8, "per model: load per replica, throughput, the passive curve, Little's law"
    for image in images:
        with Image.open(io.BytesIO(base64.b64decode(image))) as picture:
            assert picture.format == "PNG" and picture.size == (1200, 420)
    assert "model-a" in html and "Recommended actions" in html and "Little" in html
    assert (
        "Throughput against concurrency, per replica" in html and "Load per replica over the window" in html
    )
    assert re.search(r"Window \d{4}-\d\d-\d\d \d\d:\d\d UTC", html), "timestamps to the minute for people"
    assert "peak vs knee" in html and not re.search(r"headroom [−-]\d", html)


def test_peak_against_the_knee_reads_as_a_multiple_or_a_share():
    from collector.report.render_md import versus_knee, when

    assert versus_knee(7.592) == "peak is 7.6 × the knee"
    assert versus_knee(0.62) == "peak is 62 % of the knee"
    assert versus_knee(None) == "–"
    assert when("2026-11-30T09:00:00+00:00") == "2026-11-30 09:00 UTC"


def test_figures_are_per_replica_drawn_and_span_the_traffic(report):
    """Every axis has something drawn on it; time axes span the traffic (a bin either side), not
    the years matplotlib picks around a lone date; the y axes are per replica."""
    from matplotlib.dates import date2num

    from collector.report.plots import curve_figure, littles_figure, load_figure, throughput_figure

    for model in report["models"]:
        (entry,) = model["classes"]
        bins, step = entry["load"]["bins"], entry["load"]["step"]
        assert step == 3600 and len(bins) > 24
        first, last = (date2num(datetime.fromtimestamp(b["t"], UTC)) for b in (bins[0], bins[-1]))
        for axis in load_figure(model).axes:
            low, high = axis.get_xlim()
            assert first - 2 * step / 86400 <= low < first and last < high <= last + 3 * step / 86400
            assert "per replica" in axis.get_ylabel() and axis.lines[0].get_xydata().shape[0] == len(bins)
        throughput = throughput_figure(model).axes[0]
        assert "per replica" in throughput.get_xlabel() and "per replica" in throughput.get_ylabel()
        for figure in (throughput_figure(model), littles_figure(model), curve_figure(model)):
            for axis in figure.axes:
                drawn = sum(len(c.get_offsets()) for c in axis.collections) + sum(
                    len(line.get_xydata()) for line in axis.lines
                )
                assert drawn > 0, axis.get_title()


def test_a_lone_bin_is_a_marker_on_a_sane_time_axis():
    from matplotlib.dates import date2num

    from collector.report.plots import load_figure

    t = datetime(2026, 11, 30, 9, tzinfo=UTC).timestamp()
    point = {"t": t, "requests_per_replica": 3.0, "tokens_per_replica": 900.0}
    entry = {
        "replica_class": "default",
        "load": {"step": 60, "bins": [point]},
        "concurrency": {"knee_requests": 8, "knee_tokens": None, "knee_tokens_p95": None},
        "plan": {"pool_per_replica": {"requests": 5.0, "tokens": None}},
    }
    for axis in load_figure({"classes": [entry]}).axes:
        low, high = axis.get_xlim()
        assert high - low == pytest.approx(3 * 60 / 86400)  # three minutes, not four years
        assert low < date2num(datetime.fromtimestamp(t, UTC)) < high
        assert axis.lines[0].get_marker() == "o"


def test_markdown_and_json_carry_the_same_figures(report):
    md = render_report(report, "md")
    data = orjson.loads(render_report(report, "json"))
    assert data == orjson.loads(orjson.dumps(report))
    first = data["models"][0]
    assert f"| requests (vs previous) | {first['traffic']['requests']:,}" in md
    assert f"{first['latency']['ttft_s']['p95']:.3f}" in md
    assert md.count("## model-") == 2 and "p95 TTFT rose" in md


def test_report_cli_from_db_as_json_and_as_an_html_file(db_path, report, tmp_path):
    runner = CliRunner()
    result = runner.invoke(
        main, ["report", "--db", str(db_path), "--since", "7d", "--json", "-", "--slo-ttft-p95", "0.5"]
    )
    assert result.exit_code == 0, result.output
    from_db = orjson.loads(result.stdout)
    assert [m["traffic"]["requests"] for m in from_db["models"]] == [
        m["traffic"]["requests"] for m in report["models"]
    ]
    out = tmp_path / "review.html"
    result = runner.invoke(main, ["report", "--db", str(db_path), "--format", "html", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text().startswith("<!doctype html>") and "model-b" in out.read_text()


def test_report_cli_names_bad_input():
    runner = CliRunner()
    assert "give --db PATH or --lake URI" in runner.invoke(main, ["report"]).output
    assert (
        "'7 days' is neither a duration (7d, 24h) nor an ISO-8601 time"
        in runner.invoke(main, ["report", "--db", "x", "--since", "7 days"]).output
    )
    empty = runner.invoke(main, ["report", "--db", "x", "--since", "2026-11-30", "--until", "2026-11-29"])
    assert empty.exit_code == 2 and "the window is empty" in empty.output
    assert "does not exist" in runner.invoke(main, ["report", "--db", "/nonexistent/h.duckdb"]).output
