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
from pathlib import Path

import orjson
import pytest
from support.processes import HEADROOM, sim_process
from support.waiting import patient

from collector.sim.config import SimConfig
from collector.store.db import RequestStore
from collector.store.estimates import candidate_estimates

SPEED = 8.0
SEQS = 4
PROMPT_CHARS = 148  # ceil(148 / 4) = 37 text tokens + 3 chat-template tokens = 40
PROMPT_TOKENS = 40
OUTPUT = 32
TOLERANCE = 0.12


def predicted_rate_for(prompt_tokens: int):
    """The simulator's analytic μ and V_P (per second of wall time) for this test's configuration."""
    return SimConfig(max_num_seqs=SEQS, cost_profile="cpu", speed=SPEED).predicted_rate(prompt_tokens, OUTPUT)


def _probe_rates(
    url: str, rates: list[float], tmp_path: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    """`headroom probe --url URL ARGS --rates ...` (3 s per rate after 1 s of warm-up), its JSON and
    database under tmp_path; asserts it succeeded."""
    done = subprocess.run(
        [
            str(HEADROOM),
            "probe",
            "--url",
            url,
            *args,
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
        timeout=patient(150),
        env=os.environ | {"COLUMNS": "250"},  # the table's verdicts unwrapped
    )
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    return done


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.serial  # the simulator runs in real time (x8): a starved host measures a lower μ
@pytest.mark.timeout(patient(180))
def test_probe_rates_against_a_live_simulator_finds_its_analytic_rate(tmp_path):
    mu = predicted_rate_for(PROMPT_TOKENS)  # ~16.2 requests/s of wall time, V_P ~648 prompt tokens/s
    prompts = tmp_path / "prompt.txt"
    prompts.write_text("x" * PROMPT_CHARS + "\n")
    rates = [round(mu.requests_per_s * m, 2) for m in (0.6, 0.95, 1.4)]
    with sim_process(
        cost_profile="cpu", max_num_seqs=SEQS, speed=SPEED, stream_interval=8, max_waiting=2000
    ) as url:
        done = _probe_rates(
            url,
            rates,
            tmp_path,
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
        )
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
        opened = store.query("SELECT count(*) FROM requests WHERE probe_rate_per_s > 0 AND NOT probe_warmup")[
            0
        ][0]
        assert opened > 40  # the measured open-loop requests were logged with their offered rate
        (saved,) = candidate_estimates(store, 0.05)
    finally:
        store.close()
    assert saved.run_id == estimate["run_id"]
    assert saved.rate_requests_per_s == pytest.approx(measured)
    assert saved.prefill_tokens_per_s == pytest.approx(estimate["prefill_tokens_per_s"])


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.serial  # real time, as above
@pytest.mark.timeout(patient(180))
def test_two_input_length_classes_give_two_rates_in_the_simulators_ratio(tmp_path):
    """A workload file with one output class and two prompt-length classes (`inputs:`): the
    probe runs the ladder once per input class, and the two μ_slo (and V_P) stand in the ratio
    of predicted_rate's for the prompt lengths the simulator counted, within 15 %."""
    short_p, long_p = 40, 300
    mu_short = predicted_rate_for(short_p)
    mu_long = predicted_rate_for(long_p)
    assert mu_short.requests_per_s / mu_long.requests_per_s > 2.5  # the classes differ
    workload = tmp_path / "workload.yaml"
    workload.write_text(
        "classes:\n  - name: chat\n    max_tokens: 32\n"
        f"inputs:\n  - name: short\n    prompt_tokens: {short_p}\n"
        f"  - name: long\n    prompt_tokens: {long_p}\n"
    )
    # one ladder for both: the long class fails at 1.4 x its μ, the short one climbs on to its own
    rates = sorted(round(mu.requests_per_s * m, 2) for mu in (mu_short, mu_long) for m in (0.95, 1.4))
    with sim_process(
        cost_profile="cpu", max_num_seqs=SEQS, speed=SPEED, stream_interval=8, max_waiting=2000
    ) as url:
        done = _probe_rates(
            url,
            rates,
            tmp_path,
            "--workload",
            str(workload),
            "--levels",
            str(SEQS),
            "--max-samples",
            "20",
            "--max-level-seconds",
            "1",
        )
    assert "== task class chat-short: max_tokens 32, prompts of 40 tokens" in done.stdout
    estimates = orjson.loads((tmp_path / "est.json").read_bytes())["classes"]
    assert set(estimates) == {"chat-short", "chat-long"}
    store = RequestStore(str(tmp_path / "h.duckdb"))
    try:  # the prompt lengths the simulator counted (the filler is scaled to its tokenizer)
        counted = dict(
            store.query(
                "SELECT task_class, median(prompt_tokens) FROM requests "
                "WHERE outcome = 'ok' AND probe_rate_per_s > 0 GROUP BY 1"
            )
        )
    finally:
        store.close()
    assert counted["chat-short"] == pytest.approx(short_p, abs=2)
    assert counted["chat-long"] == pytest.approx(long_p, abs=4)
    truth = {name: predicted_rate_for(round(counted[name])) for name in estimates}
    short, long = estimates["chat-short"], estimates["chat-long"]
    measured_ratio = short["rate_requests_per_s"] / long["rate_requests_per_s"]
    true_ratio = truth["chat-short"].requests_per_s / truth["chat-long"].requests_per_s
    assert measured_ratio == pytest.approx(true_ratio, rel=0.15), (short["rates"], long["rates"])
    vp_ratio = short["prefill_tokens_per_s"] / long["prefill_tokens_per_s"]
    true_vp = truth["chat-short"].prefill_tokens_per_s / truth["chat-long"].prefill_tokens_per_s
    assert vp_ratio == pytest.approx(true_vp, rel=0.15)
