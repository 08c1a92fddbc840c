"""The HTML people open, in a real browser: headless Chromium renders the weekly report and the
probe page, a check in the page fails on a missing image or a console error, and the screenshots
are kept under out/screenshots/ (look at them: they are what a reviewer sees).

The check is a script this test puts first in the page's <head>: it records uncaught errors and
console.error calls, and after load every <img> that did not decode; Chromium's --dump-dom then
shows the verdict in the title. A deliberately broken page proves the check can fail.
"""

from __future__ import annotations

import json
import re
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import require_tool
from PIL import Image, ImageStat
from support.waiting import patient

ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "out" / "screenshots"
pytestmark = [pytest.mark.integration, pytest.mark.subprocess, pytest.mark.timeout(patient(240))]
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
]
_CHECK = """<script>
(function () {
  var problems = [];
  window.addEventListener("error", function (e) { problems.push("error: " + (e.message || e.type)); }, true);
  var original = console.error;
  console.error = function () { problems.push("console.error: " + Array.prototype.join.call(arguments, " "));
                                return original.apply(console, arguments); };
  window.addEventListener("load", function () {
    var images = document.images;
    for (var i = 0; i < images.length; i++) {
      if (!images[i].complete || images[i].naturalWidth === 0) { problems.push("image did not load: " + images[i].alt); }
    }
    document.title = "CHECK " + JSON.stringify({images: images.length, problems: problems});
  });
})();
</script>"""


def _checked(html: str) -> str:
    return re.sub(r"<head>", "<head>" + _CHECK, html, count=1)


def _browse(
    chromium: str, page: Path, tmp_path: Path, screenshot: Path | None = None, height: int = 2600
) -> dict:
    """Load `page` in headless Chromium; the check's verdict, and a screenshot when asked."""
    profile = tmp_path / "chromium-profile"
    common = [chromium, *FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=10000"]
    dom = subprocess.run(
        [*common, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=patient(90)
    )
    match = re.search(r"<title>CHECK (.*?)</title>", dom.stdout)
    assert match, f"the page never finished loading in Chromium:\n{dom.stderr[-2000:]}"
    verdict = json.loads(match.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    if screenshot is not None:
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        shot = subprocess.run(
            [*common, f"--window-size=1300,{height}", f"--screenshot={screenshot}", page.as_uri()],
            capture_output=True,
            text=True,
            timeout=patient(90),
        )
        assert shot.returncode == 0 and screenshot.is_file(), shot.stderr[-2000:]
    return verdict


def _looks_drawn(png: Path, height: int = 2600) -> None:
    with Image.open(png) as picture:
        assert picture.size == (1300, height)
        grey = picture.convert("L")
        inked = sum(grey.histogram()[:200]) / (grey.size[0] * grey.size[1])
        assert ImageStat.Stat(grey).stddev[0] > 20 and inked > 0.015, f"{png.name} is nearly blank"


@pytest.fixture(scope="module")
def chromium() -> str:
    return require_tool("chromium")


def test_the_check_fails_on_a_broken_page(chromium, tmp_path):
    page = tmp_path / "broken.html"
    page.write_text(
        _checked(
            "<!doctype html><html><head><title>x</title></head><body>"
            "<img alt='plot' src='data:image/png;base64,bm90IGEgcG5n'>"
            "<script>undefinedFunction();</script></body></html>"
        )
    )
    verdict = _browse(chromium, page, tmp_path)
    assert any("image did not load: plot" in p for p in verdict["problems"])
    assert any(p.startswith("error:") for p in verdict["problems"])


def test_weekly_report_renders_whole_in_chromium(chromium, tmp_path):
    from support.synthetic import synthetic_rows
    from test_analysis_estimate import _estimate

    from collector.report.review import render_report_from_store
    from collector.store.db import RequestStore
    from collector.store.estimates import save_estimate
    from collector.timewin import utc_now

    store = RequestStore(tmp_path / "h.duckdb")
    now = utc_now()
    store.insert_rows(
        synthetic_rows(
            2000, now - timedelta(days=13), span=timedelta(days=13), prefix="w", models=("llama-3-8b",)
        )
    )
    save_estimate(store, _estimate(model="llama-3-8b", knee_at=8))
    html = render_report_from_store(store, "7d", "html", slo_ttft_p95_s=0.5)
    store.close()
    page = tmp_path / "weekly-report.html"
    page.write_text(_checked(html))
    verdict = _browse(chromium, page, tmp_path, SHOTS / "weekly-report.png")
    assert verdict == {"images": 4, "problems": []}
    _looks_drawn(SHOTS / "weekly-report.png")
    _plots_drawn(html)


def _plots_drawn(html: str) -> None:
    """Every embedded plot has ink beyond its frame: a plot with nothing drawn is mostly white."""
    import base64
    import io

    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert images
    for image in images:
        with Image.open(io.BytesIO(base64.b64decode(image))) as picture:
            grey = picture.convert("L")
            # coloured data (lines, markers) is mid-grey once converted; axes and text are black
            data = sum(grey.histogram()[60:230]) / (grey.size[0] * grey.size[1])
            assert data > 0.004, "a plot with nothing drawn"


def _axes_sane(report: dict) -> None:
    """Time axes span the traffic (a bin or two either side), never years around one point; a
    series of few points has markers; every axis has data drawn."""
    from matplotlib.dates import date2num

    from collector.report.plots import curve_figure, littles_figure, load_figure, throughput_figure

    for model in report["models"]:
        for entry in model["classes"]:
            bins, step = entry["load"]["bins"], entry["load"]["step"]
            first, last = (date2num(datetime.fromtimestamp(b["t"], UTC)) for b in (bins[0], bins[-1]))
            for axis in load_figure(model).axes:
                low, high = axis.get_xlim()
                assert first - 2 * step / 86400 <= low and high <= last + 3 * step / 86400
                assert "per replica" in axis.get_ylabel()
        for figure in (
            load_figure(model),
            throughput_figure(model),
            littles_figure(model),
            curve_figure(model),
        ):
            for axis in figure.axes:
                drawn = sum(len(c.get_offsets()) for c in axis.collections) + sum(
                    len(line.get_xydata()) for line in axis.lines
                )
                assert drawn > 0, f"{axis.get_title() or axis.get_ylabel()}: nothing drawn"


def _review_in_chromium(chromium: str, tmp_path: Path, report: dict, name: str) -> str:
    from collector.report.review import render_report

    html = render_report(report, "html")
    page = tmp_path / f"{name}.html"
    page.write_text(_checked(html))
    verdict = _browse(chromium, page, tmp_path, SHOTS / f"{name}.png", height=3400)
    assert verdict == {"images": 4 * len(report["models"]), "problems": []}
    _looks_drawn(SHOTS / f"{name}.png", height=3400)
    _plots_drawn(html)
    _axes_sane(report)
    return html.replace("&#x27;", "'")


def test_the_review_of_one_hour_of_the_simulator_plans_in_chromium(chromium, tmp_path):
    """Under an hour of traffic: 20 closed-loop clients against a simulator of 8 slots, probed and
    published; the planning line gives ceil(20 / the published pool) replicas."""
    import math

    from test_report_plan import CLIENTS, _published_pool, one_hour_store

    from collector.report.review import build_from_store

    store, now = one_hour_store(tmp_path / "one-hour.duckdb")
    report = build_from_store(store, "7d", now)
    pool = _published_pool(store, now)
    store.close()
    html = _review_in_chromium(chromium, tmp_path, report, "weekly-report-one-hour")
    needed = math.ceil(CLIENTS / pool)
    assert f"At this week's peak you needed {needed} replicas of class slots8 (you ran 1)" in html
    assert "published because: probe run probe-sim" in html


def test_the_review_of_the_demo_database_plans_in_chromium(chromium, tmp_path):
    import math

    from click.testing import CliRunner

    from collector.cli import main
    from collector.report.review import build_from_store
    from collector.store.db import RequestStore
    from collector.store.decision import decisions
    from collector.timewin import utc_now

    db = tmp_path / "demo.duckdb"
    args = ["demo", "--speed", "4", "--levels", "1,4,16,32", "--level-seconds", "2", "--db", str(db)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    store = RequestStore(db, read_only=True)
    now = utc_now()
    report = build_from_store(store, "7d", now)
    published = {d.replica_class: d.estimate for d in decisions(store, now) if d.task_class == "all"}
    store.close()
    html = _review_in_chromium(chromium, tmp_path, report, "weekly-report-demo")
    (model,) = report["models"]
    for entry in model["classes"]:
        plan, estimate = entry["plan"], published[entry["replica_class"]]
        assert estimate is not None and plan["pool_per_replica"]["requests"] == estimate.recommended_pool
        caliber = plan["binding_caliber"]
        expected = math.ceil(plan["peak"][caliber] / plan["pool_per_replica"][caliber] - 1e-9)
        assert plan["replicas_needed"] == expected >= 1
        line = f"At this week's peak you needed {expected} replica"
        assert line in html and f"of class {entry['replica_class']} (you ran 1)" in html


def test_probe_page_renders_whole_in_chromium(chromium, tmp_path):
    from test_analysis_estimate import _estimate

    from collector.analysis.plot import write_plot

    _, html = write_plot(_estimate(model="llama-3-8b", knee_at=8, slo_ttft=0.5), tmp_path / "knee.png")
    page = tmp_path / "probe.html"
    page.write_text(_checked(html.read_text()))
    verdict = _browse(chromium, page, tmp_path, SHOTS / "probe.png", height=1200)
    assert verdict == {"images": 1, "problems": []}
    _looks_drawn(SHOTS / "probe.png", height=1200)
