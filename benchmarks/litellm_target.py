"""LiteLLM's proxy as an optional benchmark target (the peer a user would deploy instead).

    python benchmarks/litellm_target.py install     # once; prints the venv it made, or why not

It is installed into its own virtualenv under ~/.cache/llm-headroom/ (never into the project's),
pinned to one version so figures compare across runs. `start(port, upstream)` returns a
running `litellm` process configured with one model `bench` pointing at the upstream, or None
with the reason printed when it cannot be installed or started (no network, no wheel for this
Python): the benchmark then runs without it. LiteLLM refuses to start without a master key, so
it gets one and every target is sent it (`Authorization: Bearer MASTER_KEY`) alike.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import start
from _load import KEY as MASTER_KEY  # loopback only; LiteLLM refuses to start without a key

VERSION = "1.108.7"
VENV = Path.home() / ".cache" / "llm-headroom" / f"litellm-{VERSION}"
_CONFIG = """general_settings:
  master_key: {key}
model_list:
  - model_name: bench
    litellm_params:
      model: openai/bench
      api_base: {upstream}/v1
      api_key: none
litellm_settings:
  drop_params: true
  telemetry: false
"""


def install() -> Path | None:
    """The `litellm` executable, installing it first if needed; None (reason printed) on failure."""
    executable = VENV / "bin" / "litellm"
    if executable.exists():
        return executable
    try:
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, capture_output=True)
        subprocess.run(
            [str(VENV / "bin" / "pip"), "install", "--quiet", f"litellm[proxy]=={VERSION}"],
            check=True,
            capture_output=True,
            timeout=900,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        output = getattr(exc, "stderr", b"") or b""
        print(
            f"litellm target skipped: cannot install litellm[proxy]=={VERSION} into {VENV} "
            f"({type(exc).__name__}: {output.decode(errors='replace')[-300:].strip()})",
            file=sys.stderr,
        )
        return None
    return executable if executable.exists() else None


def start_litellm(port: int, upstream: str) -> subprocess.Popen | None:
    """A LiteLLM proxy on 127.0.0.1:port in front of `upstream`, or None when unavailable."""
    executable = install()
    if executable is None:
        return None
    config = Path(tempfile.mkdtemp()) / "litellm.yaml"
    config.write_text(_CONFIG.format(upstream=upstream, key=MASTER_KEY))
    env = os.environ | {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_LOG": "ERROR",
        "LITELLM_TELEMETRY": "False",
        "DISABLE_SCHEMA_UPDATE": "True",
    }
    try:
        return start(
            [
                str(executable),
                "--config",
                str(config),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--num_workers",
                "1",
            ],
            f"http://127.0.0.1:{port}/health/liveliness",
            timeout_s=120.0,
            env=env,
        )
    except RuntimeError as exc:
        print(f"litellm target skipped: {exc}", file=sys.stderr)
        return None


if __name__ == "__main__":
    if sys.argv[1:] == ["install"]:
        print(install() or "not installed")
