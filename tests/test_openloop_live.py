"""The live open-loop path: the real `headroom probe --rates` CLI against `headroom sim` serving
on loopback (collector.analysis.openloop.run_rates over HTTP, the CLI's table, Little's-law line,
JSON and --db estimate).

The simulator runs the cpu cost profile at 4 slots and `--speed 8`, with one fixed 40-token
prompt (148 characters + the chat template's 3) and 32 output tokens, so its analytic open-loop
capacity (collector.sim.cost.predicted_rate, x the speed) is the ground truth: μ_slo and V_P
within 12 %. The ladder is short on purpose (3 s levels after 1 s of warm-up): below μ, near it,
and well past it, where the level drifts or ends early and caps μ_slo at the saturation
throughput it completed. About 25 s of wall time, ~3 s of CPU.
"""

from __future__ import annotations

import os
import subprocess

import orjson
import pytest

from collector.sim.config import SimConfig
from collector.sim.cost import COST_PROFILES, predicted_rate
from collector.store.db import RequestStore
from collector.store.estimates import candidate_estimates
from tests.support.processes import HEADROOM, sim_process

SPEED = 8.0
SEQS = 4
PROMPT_CHARS = 148  # ceil(148 / 4) = 37 text tokens + 3 chat-template tokens = 40
PROMPT_TOKENS = 40
OUTPUT = 32
TOLERANCE = 0.12


def truth():
    config = SimConfig(max_num_seqs=SEQS, cost_profile="cpu")
    return predicted_rate(
        COST_PROFILES["cpu"],
        max_num_seqs=SEQS,
        max_num_batched_tokens=config.max_num_batched_tokens,
        kv_cache_tokens=config.kv_cache_tokens,
        block_size=config.block_size,
        prompt_tokens=PROMPT_TOKENS,
        output_tokens=OUTPUT,
        speed=SPEED,
    )


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.serial  # the simulator runs in real time (x8): a starved host measures a lower μ
@pytest.mark.timeout(180)
def test_probe_rates_against_a_live_simulator_finds_its_analytic_rate(tmp_path):
    mu = truth()  # ~16.2 requests/s of wall time, V_P ~648 prompt tokens/s
    prompts = tmp_path / "prompt.txt"
    prompts.write_text("x" * PROMPT_CHARS + "\n")
    rates = [round(mu.requests_per_s * m, 2) for m in (0.6, 0.95, 1.4)]
    with sim_process(
        cost_profile="cpu", max_num_seqs=SEQS, speed=SPEED, stream_interval=8, max_waiting=2000
    ) as url:
        done = subprocess.run(
            [
                str(HEADROOM),
                "probe",
                "--url",
                url,
                "--levels",
                "2,4,8",
                "--max-tokens",
                str(OUTPUT),
                "--prompts",
                str(prompts),
                "--max-samples",
                "30",
                "--max-level-seconds",
                "2",
                "--rates",
                ",".join(map(str, rates)),
                "--rate-seconds",
                "3",
                "--rate-warmup-seconds",
                "1",
                "--json",
                str(tmp_path / "est.json"),
                "--db",
                str(tmp_path / "h.duckdb"),
            ],
            capture_output=True,
            text=True,
            timeout=150,
            env=os.environ | {"COLUMNS": "250"},  # the table's verdicts unwrapped
        )
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    out = done.stdout
    assert "open loop (Poisson arrivals)" in out
    assert "Little's law: consistent: knee 4 ≈" in out, out[-3000:]

    estimate = orjson.loads((tmp_path / "est.json").read_bytes())
    section = estimate["rates"]
    assert [level["offered_per_s"] for level in section["levels"]] == rates[: len(section["levels"])]
    assert section["littles_law"]["consistent"] is True
    assert section["littles_law"]["knee"] == SEQS
    measured = estimate["rate_requests_per_s"]
    assert section["mu_slo_requests_per_s"] == pytest.approx(measured, abs=1e-5)
    assert measured == pytest.approx(mu.requests_per_s, rel=TOLERANCE), section["reason"]
    assert estimate["prefill_tokens_per_s"] == pytest.approx(mu.prefill_tokens_per_s, rel=TOLERANCE)
    assert f"μ_slo {measured:.3g} requests/s" in out

    store = RequestStore(str(tmp_path / "h.duckdb"))
    try:
        # the premise: every request the simulator answered had the 40-token prompt
        assert store.query("SELECT DISTINCT prompt_tokens FROM requests WHERE outcome = 'ok'") == [
            (PROMPT_TOKENS,)
        ]
        opened = store.query(
            "SELECT count(*) FROM requests WHERE regexp_matches(request_id, '-o[0-9]{7}-[0-9]+$')"
        )[0][0]
        assert opened > 40  # the measured open-loop requests were logged with their rate in the id
        (saved,) = candidate_estimates(store, 0.05)
    finally:
        store.close()
    assert saved["run_id"] == estimate["run_id"]
    assert saved["rate_requests_per_s"] == pytest.approx(measured)
    assert saved["prefill_tokens_per_s"] == pytest.approx(estimate["prefill_tokens_per_s"])
