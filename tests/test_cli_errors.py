"""A newcomer's obvious mistakes get one clear line naming the input and what to do, not a traceback.

Each case runs the real command (click's runner over `collector.cli.main`) against real files: a
path that does not exist, a file that is not a DuckDB database, a database another process holds
open (a real second process takes DuckDB's lock), a URL without a scheme, an unreachable service.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys

import pytest
from click.testing import CliRunner
from support.waiting import patient

from collector.cli import main


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def _one_clear_error(result, *expected: str, code: int = 1) -> None:
    """Exit `code`, no traceback, an `Error:` line that contains every `expected` fragment."""
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    line = next(line for line in result.output.splitlines() if line.startswith("Error:"))
    for fragment in expected:
        assert fragment in line, line


@pytest.fixture
def not_duckdb(tmp_path):
    path = tmp_path / "notes.duckdb"
    path.write_text("this is not a database\n" * 100)
    return path


@pytest.fixture
def locked_db(tmp_path):
    """A DuckDB file a second process holds open read-write, as a running sidecar would."""
    path = tmp_path / "held.duckdb"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import duckdb, sys; c = duckdb.connect(sys.argv[1]); "
            "print('ready', flush=True); sys.stdin.read()",
            str(path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        yield path
    finally:
        holder.stdin.close()
        holder.wait(timeout=patient(30))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_capacity_curve_missing_db_says_which_file(tmp_path):
    missing = tmp_path / "nope.duckdb"
    _one_clear_error(run("capacity", "curve", "--db", str(missing)), str(missing), "does not exist")
    assert not missing.exists()  # a read-only command creates nothing


def test_capacity_curve_not_a_duckdb_file(not_duckdb):
    _one_clear_error(
        run("capacity", "curve", "--db", str(not_duckdb)),
        str(not_duckdb),
        "not a valid DuckDB",
        "pass a DuckDB file",
    )


@pytest.mark.subprocess
def test_capacity_curve_on_a_held_db_says_who_to_ask(locked_db):
    _one_clear_error(
        run("capacity", "curve", "--db", str(locked_db)), str(locked_db), "holds", "left no readable"
    )


def test_report_on_a_file_that_is_not_duckdb(not_duckdb):
    _one_clear_error(
        run("report", "--db", str(not_duckdb)), str(not_duckdb), "pass the request log a sidecar wrote"
    )


def test_report_out_of_memory_says_so_not_that_the_file_is_wrong(tmp_path, monkeypatch):
    import duckdb

    from collector.report import cli as report_cli
    from collector.store.db import RequestStore

    RequestStore(tmp_path / "log.duckdb").close()

    def out_of_memory(*args, **options):
        raise duckdb.OutOfMemoryException("Out of Memory Error: could not allocate block of size 256.0 KiB")

    monkeypatch.setattr(report_cli, "collect_inputs", out_of_memory)
    result = CliRunner().invoke(main, ["report", "--db", str(tmp_path / "log.duckdb")])
    assert result.exit_code == 1
    assert "ran out of memory building the review" in result.output and "cannot open" not in result.output


@pytest.mark.subprocess
def test_report_on_a_held_db_says_who_holds_it(locked_db):
    _one_clear_error(run("report", "--db", str(locked_db)), str(locked_db), "holds", "left no readable")


def _owner_file(db, token: str) -> str:
    url = f"http://127.0.0.1:{_closed_port()}/headroom"
    record = f'{{"url": "{url}", "proxy": null, "token": "{token}", "pid": 1}}'
    (db.parent / f"{db.name}.owner").write_text(record)
    return url


@pytest.mark.subprocess
@pytest.mark.parametrize("command", [("report",), ("capacity", "curve"), ("alerts", "backtest")])
def test_an_unreachable_owner_is_one_line_naming_it(locked_db, command):
    (locked_db.parent / f"{locked_db.name}.token").write_text("t\n")
    url = _owner_file(locked_db, "file")
    result = run(*command, "--db", str(locked_db))
    _one_clear_error(result, url, "cannot reach the owner", "(ConnectError)", "is it still running")
    assert "Errno" not in result.output and "httpx" not in result.output


@pytest.mark.subprocess
def test_a_missing_token_is_one_line_naming_headroom_token(locked_db, monkeypatch):
    monkeypatch.delenv("HEADROOM_TOKEN", raising=False)
    _owner_file(locked_db, "env")
    result = run("report", "--db", str(locked_db))
    _one_clear_error(result, "its token was not found", "set HEADROOM_TOKEN")
    assert "Illegal header" not in result.output


def test_the_retired_store_command_says_what_replaced_it():
    _one_clear_error(run("store", "--db", "x.duckdb"), "headroom store` is gone", "--lake", code=2)


@pytest.mark.parametrize(
    "args, hint",
    [
        (["--url", "127.0.0.1:9100"], "--url"),
    ],
)
def test_probe_url_without_scheme_is_a_usage_error(args, hint):
    _one_clear_error(run("probe", *args), hint, "is not an http(s) URL", "http://127.0.0.1:", code=2)


def test_probe_db_that_is_not_duckdb_is_not_blamed_on_a_sidecar(not_duckdb):
    result = run("probe", "--url", f"http://127.0.0.1:{_closed_port()}", "--db", str(not_duckdb))
    _one_clear_error(result, str(not_duckdb), "pass a DuckDB file")
    assert "sidecar owns" not in result.output


@pytest.mark.subprocess
def test_probe_db_held_without_an_owner_file_says_so(locked_db):
    result = run("probe", "--url", f"http://127.0.0.1:{_closed_port()}", "--db", str(locked_db))
    _one_clear_error(result, str(locked_db), "left no readable")


def test_demo_with_a_db_that_is_not_duckdb(not_duckdb):
    result = run("demo", "--db", str(not_duckdb), "--levels", "1", "--level-seconds", "0.5")
    _one_clear_error(result, str(not_duckdb), "pass a new path")
    assert not_duckdb.read_text().startswith("this is not a database")  # nothing overwritten


def test_dashboards_push_url_without_scheme(tmp_path):
    result = run(
        "dashboards", "push", "--grafana-url", "grafana:3000", "--token", "t", "--dir", str(tmp_path)
    )
    _one_clear_error(result, "--grafana-url", "'grafana:3000'", "http://grafana:3000", code=2)


def test_dashboards_push_help_names_its_environment_variables():
    result = run("dashboards", "push", "--help")
    assert result.exit_code == 0
    assert "[env:" in result.output and "GRAFANA_URL]" in result.output and "GRAFANA_TOKEN]" in result.output


def test_report_out_in_a_missing_directory(tmp_path):
    from collector.store.db import RequestStore

    db = tmp_path / "log.duckdb"
    RequestStore(db).close()
    out = tmp_path / "no" / "such" / "review.md"
    _one_clear_error(run("report", "--db", str(db), "--out", str(out)), str(out), "writable directory")


@pytest.mark.parametrize("group", ["dashboards", "alerts"])
def test_generate_into_an_unwritable_place(tmp_path, group):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    out = blocker / "sub"  # a directory below a regular file cannot be created
    _one_clear_error(run(group, "generate", "--out", str(out)), str(out), "pass a directory you can write to")


def test_probe_unwritable_json_path_after_the_run(tmp_path):
    """The run's estimate is printed, then one error line names the path it could not write."""
    from test_probe_fake import TOKENS, fake_app

    from collector.serving import serve_in_thread

    server = serve_in_thread(fake_app(slots=2))
    try:
        blocker = tmp_path / "a-file"
        blocker.write_text("x")
        bad = blocker / "cap.json"
        result = run(
            "probe",
            "--url",
            server.url,
            "--levels",
            "1,2,4",
            "--max-tokens",
            str(TOKENS),
            "--max-samples",
            "12",
            "--json",
            str(bad),
        )
    finally:
        server.stop()
    _one_clear_error(result, str(blocker), "the estimate is printed above")
    # printed above it: the estimate (its knee is a wall-clock measurement, and this test runs in
    # the parallel part: the value is not this test's business, test_probe_fake pins it)
    assert re.search(r"knee: \d+ requests", result.output), result.output


def test_demo_unwritable_json_prints_the_summary_then_one_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    bad = blocker / "demo.json"
    result = run(
        "demo",
        "--levels",
        "1,2",
        "--level-seconds",
        "0.6",
        "--speed",
        "8",
        "--db",
        str(tmp_path / "demo.duckdb"),
        "--json",
        str(bad),
    )
    _one_clear_error(result, str(bad), "the summary is printed above")
    assert "Where things live" in result.output and str(bad) not in result.output.split("Error:")[0]


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["demo", "--levels", "1,x"], ["--levels", "'1,x'", "e.g. 1,2,4,8"]),
        (["demo", "--speed", "0"], ["--speed", "must be positive"]),
        (["demo", "--level-seconds", "0.1"], ["--level-seconds", "0.10 s"]),
        (["probe", "--url", "http://127.0.0.1:9100", "--levels", "0"], ["--levels", "'0'", "positive"]),
    ],
)
def test_bad_option_values_name_the_option(args, fragments):
    _one_clear_error(run(*args), *fragments, code=2)


def test_capacity_curve_bad_time_names_the_option(tmp_path):
    from collector.store.db import RequestStore

    db = tmp_path / "log.duckdb"
    RequestStore(db).close()
    _one_clear_error(
        run("capacity", "curve", "--db", str(db), "--until", "tomorrow"),
        "--until",
        "'tomorrow'",
        "ISO-8601 time",
        code=2,
    )
