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
from datetime import timedelta
from pathlib import Path

import pytest
from conftest import require_tool
from PIL import Image, ImageStat

ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "out" / "screenshots"
pytestmark = [pytest.mark.integration, pytest.mark.subprocess, pytest.mark.timeout(240)]
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
    dom = subprocess.run([*common, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=90)
    match = re.search(r"<title>CHECK (.*?)</title>", dom.stdout)
    assert match, f"the page never finished loading in Chromium:\n{dom.stderr[-2000:]}"
    verdict = json.loads(match.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    if screenshot is not None:
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        shot = subprocess.run(
            [*common, f"--window-size=1300,{height}", f"--screenshot={screenshot}", page.as_uri()],
            capture_output=True,
            text=True,
            timeout=90,
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
    from test_analysis_estimate import _estimate

    from collector.analysis.estimate import save_estimate
    from collector.report.review import render_report_from_store
    from collector.store.db import RequestStore
    from collector.store.synthetic import synthetic_rows
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
    assert verdict == {"images": 3, "problems": []}
    _looks_drawn(SHOTS / "weekly-report.png")


def test_probe_page_renders_whole_in_chromium(chromium, tmp_path):
    from test_analysis_estimate import _estimate

    from collector.analysis.plot import write_plot

    _, html = write_plot(_estimate(model="llama-3-8b", knee_at=8, slo_ttft=0.5), tmp_path / "knee.png")
    page = tmp_path / "probe.html"
    page.write_text(_checked(html.read_text()))
    verdict = _browse(chromium, page, tmp_path, SHOTS / "probe.png", height=1200)
    assert verdict == {"images": 1, "problems": []}
    _looks_drawn(SHOTS / "probe.png", height=1200)
