"""`headroom capacity kv|quota|curve` and the plot: outputs a user reads, errors a user causes."""

from __future__ import annotations

import base64
import io
import json

import pytest
from click.testing import CliRunner
from PIL import Image
from support.synthetic import closed_loop_rows
from test_analysis_estimate import _estimate

from collector.analysis.plot import render_html, render_png, write_plot
from collector.cli import main
from collector.store.db import RequestStore


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_kv_worked_example():
    result = run("capacity", "kv", "--usable-gb", "57", "--kv-per-request-gb", "3")
    assert result.exit_code == 0, result.output
    assert "memory ceiling:      19" in result.output and "configure (~70 %):   13" in result.output


def test_kv_from_model_shape_as_json():
    result = run(
        "capacity",
        "kv",
        "--gpu-memory-gb",
        "96",
        "--weights-gb",
        "20",
        "--layers",
        "80",
        "--kv-heads",
        "8",
        "--head-dim",
        "128",
        "--max-context",
        "8192",
        "--json",
        "-",
    )
    data = json.loads(result.stdout)
    assert "memory ceiling:      21 concurrent requests" in result.stderr  # the text, off stdout
    assert data["kv_bytes_per_token"] == 327680 and (data["ceiling"], data["configure"]) == (21, 14)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--kv-per-request-gb", "3"], "--usable-gb, or --gpu-memory-gb"),
        (["--usable-gb", "57"], "--kv-per-request-gb, or --layers"),
        (["--gpu-memory-gb", "24", "--weights-gb", "30", "--kv-per-request-gb", "1"], "nothing left"),
    ],
)
def test_kv_usage_errors(args, message):
    result = run("capacity", "kv", *args)
    assert result.exit_code == 2 and message in result.output


def test_quota_ceiling_says_which_binds():
    result = run(
        "capacity",
        "quota",
        "--rpm",
        "600",
        "--tpm",
        "1000000",
        "--mean-e2e-s",
        "10",
        "--mean-tokens-per-request",
        "4000",
    )
    assert result.exit_code == 0 and "ceiling: 41 concurrent requests (TPM binds)" in result.output
    assert run("capacity", "quota", "--mean-e2e-s", "10").exit_code == 2


def test_curve_from_a_request_log(tmp_path):
    store = RequestStore(tmp_path / "log.duckdb")
    store.insert_rows(closed_loop_rows(slots=8, seconds_per_level=40))
    store.close()
    result = run("capacity", "curve", "--db", str(tmp_path / "log.duckdb"), "--json", "-")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["knee"]["requests"] == 8 and [lv["concurrency"] for lv in data["levels"]][:4] == [1, 2, 4, 8]
    assert run("capacity", "curve", "--db", str(tmp_path / "log.duckdb"), "--since", "nope").exit_code == 2


@pytest.mark.parametrize(
    "command", [["probe"], ["capacity"], ["capacity", "kv"], ["capacity", "quota"], ["capacity", "curve"]]
)
def test_every_command_has_help_with_examples(command):
    result = run(*command, "--help")
    assert result.exit_code == 0 and "Examples:" in result.output and "headroom " in result.output


def test_png_has_the_requested_size_and_html_embeds_it(tmp_path):
    estimate = _estimate(slo_ttft=0.5)
    png = render_png(estimate, size_px=(800, 500))
    with Image.open(io.BytesIO(png)) as image:
        assert (image.format, image.size) == ("PNG", (800, 500))
        assert len(image.convert("L").getcolors(maxcolors=100_000)) > 10  # something is drawn
    page = render_html(estimate, png)
    assert base64.b64encode(png).decode() in page
    assert "src='http" not in page and "<script" not in page  # self-contained
    header = page[page.index("<table>") : page.index("</tr>", page.index("<table>"))]
    assert "<th>requests in flight</th>" in header and "<th>active tokens (mean at admission)</th>" in header
    assert "_s<" not in header and "total_tokens" not in header  # names for people, not field names
    first_row = page[page.index("</tr>", page.index("<table>")) :].split("</tr>")[1]
    assert "<td>150</td>" in first_row  # level 1's mean active tokens
    png_path, html_path = write_plot(estimate, tmp_path / "out" / "cap.html")
    assert png_path.suffix == ".png" and html_path.exists() and png_path.stat().st_size > 10_000
