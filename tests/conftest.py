"""Shared test rules: real-tool lookup that fails in CI instead of skipping, the fixtures path, and
the `subprocess` marker. The plumbing (fake upstream, process helper, wait_until) is tests/support."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # `import support` from any test, any rootdir
from support.processes import free_port  # noqa: E402  (re-exported for the tests that import it)
from support.waiting import patient  # noqa: E402

__all__ = ["require_tool", "free_port", "FIXTURES", "IN_CI"]
pytest_plugins = ["support.engine"]  # the fake_engine fixture, for every test that names it

FIXTURES = Path(__file__).parent / "fixtures"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_tool(name: str) -> str:
    """Path of a real binary (promtool, prometheus, amtool, prometheus-alertmanager, vmalert, ...).

    Missing in CI (CI=true) is a failure: the suite must prove the real thing. Elsewhere it skips
    with the command that installs it.
    """
    path = shutil.which(name)
    if path:
        return path
    message = (
        f"{name} not found; install with: make tools "
        "(apt-get install prometheus prometheus-alertmanager victoria-metrics)"
    )
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


def pytest_configure(config: pytest.Config) -> None:
    """Build matplotlib's font cache before any test runs. On a machine that never imported it (a
    fresh CI runner), the first import runs `fc-list` to find fonts, and inside a test not marked
    `subprocess` that is refused below: dozens of plotting tests failed on a clean machine only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.font_manager  # noqa: F401  (the import builds and saves the cache)


# pytest-timeout's bound for a test without its own mark (pyproject's `timeout` is 300 s): a hang
# detector, stretched like every other deadline (support/waiting.py). 20,000 streams through the
# sidecar passed 300 s beside two CPU hogs and a busy suite.
DEFAULT_TIMEOUT_S = patient(150)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Integration and real-engine tests run real binaries: they are subprocess tests too. A test
    without its own timeout mark gets DEFAULT_TIMEOUT_S."""
    for item in items:
        if item.get_closest_marker("integration") or item.get_closest_marker("real_engine"):
            item.add_marker(pytest.mark.subprocess)
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(max(DEFAULT_TIMEOUT_S, 300)))


@pytest.fixture(autouse=True)
def _subprocesses_are_marked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test that starts a process must say so (`@pytest.mark.subprocess`): `make test-fast`
    leaves those out, and this fixture makes an unmarked one fail instead of slipping in."""
    if request.node.get_closest_marker("subprocess") is not None:
        return

    def refuse(self: subprocess.Popen[bytes], *args: object, **kwargs: object) -> None:
        raise AssertionError(f"{request.node.nodeid} starts a subprocess; mark it @pytest.mark.subprocess")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
