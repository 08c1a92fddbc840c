"""Goodput (collector.goodput): every finished request judged once against the SLO that applied to
it, exported as headroom_slo_requests_total{verdict} and stored on its row, so that goodput from
/metrics equals goodput recomputed from the request log, exactly; shed, aborted and failed requests
count against it, so shedding lowers attainment."""

from __future__ import annotations

from collections import Counter

import httpx
import pytest
from support.sidecar import CHAT, Rig, sidecar_rig
from support.waiting import patient, wait_until

from collector.goodput import PRESETS, VERDICTS, RequestSlo, request_slo, slo_header_values, verdict
from collector.sidecar.config import SidecarConfig

SLO = RequestSlo(ttft_s=0.25, tpot_s=0.5, e2e_s=60.0)


# --- the rule ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("outcome", "stream", "ttft", "tpot", "e2e", "expected"),
    [
        ("ok", True, 0.1, 0.01, 1.0, "met"),
        ("ok", True, 0.25, 0.5, 60.0, "met"),  # a bound is inclusive
        ("ok", True, 0.26, 0.01, 1.0, "missed"),  # TTFT
        ("ok", True, 0.1, 0.51, 1.0, "missed"),  # TPOT
        ("ok", True, None, None, 0.1, "missed"),  # a stream that never sent a token misses TTFT
        ("ok", False, None, None, 30.0, "met"),  # non-streamed: judged by e2e
        ("ok", False, None, None, 61.0, "missed"),
        ("ok", True, 0.1, None, 61.0, "missed"),  # e2e judges every request
        ("rate_limited", True, None, None, 0.01, "shed"),
        ("overloaded", True, None, None, 0.01, "shed"),
        ("client_cancelled", True, 0.1, None, 5.0, "aborted"),
        ("upstream_error", True, 0.1, None, 1.0, "error"),
        ("timeout", True, None, None, 600.0, "error"),
        ("bad_request", True, None, None, 0.01, "invalid"),
    ],
)
def test_a_verdict_for_every_outcome(outcome, stream, ttft, tpot, e2e, expected):
    assert verdict(outcome, stream, ttft_s=ttft, tpot_s=tpot, e2e_s=e2e, slo=SLO) == expected


def test_no_bound_means_every_answered_request_meets_it_and_failures_still_miss():
    none = PRESETS["none"]
    assert verdict("ok", True, ttft_s=None, tpot_s=None, e2e_s=900.0, slo=none) == "met"
    assert verdict("overloaded", True, ttft_s=None, tpot_s=None, e2e_s=0.1, slo=none) == "shed"


def test_the_mlperf_presets_are_its_server_bounds():
    assert (PRESETS["mlperf-server"].ttft_s, PRESETS["mlperf-server"].tpot_s) == (2.0, 0.1)
    assert (PRESETS["mlperf-interactive"].ttft_s, PRESETS["mlperf-interactive"].tpot_s) == (0.5, 0.03)
    assert (PRESETS["mlperf-70b-interactive"].ttft_s, PRESETS["mlperf-70b-interactive"].tpot_s) == (
        0.45,
        0.04,
    )


@pytest.mark.parametrize(
    ("ttft", "tpot", "mode", "expected", "malformed"),
    [
        (b"100", None, "tighten", (0.1, 0.5, 60.0), False),
        (b"900", None, "tighten", (0.25, 0.5, 60.0), False),  # never widened
        (b"900", b"40", "trust", (0.9, 0.04, 60.0), False),  # unless trusted
        (b"100", None, "ignore", (0.25, 0.5, 60.0), False),
        (b"abc", b"40", "tighten", (0.25, 0.04, 60.0), True),  # the bad one ignored, the good one kept
        (b"-5", None, "tighten", (0.25, 0.5, 60.0), True),
        (b"0", None, "tighten", (0.25, 0.5, 60.0), True),
        (b"nan", None, "tighten", (0.25, 0.5, 60.0), True),
        (b"inf", None, "trust", (0.25, 0.5, 60.0), True),
        (b"3600001", None, "trust", (0.25, 0.5, 60.0), True),  # past an hour
        (b"1" * 40, None, "trust", (0.25, 0.5, 60.0), True),  # too long to read
        (b" 50 ", None, "tighten", (0.05, 0.5, 60.0), False),
    ],
)
def test_slo_headers_narrow_the_configured_slo_and_bad_ones_are_ignored(
    ttft, tpot, mode, expected, malformed
):
    slo, bad = request_slo(SLO, ttft, tpot, mode)
    assert (slo.ttft_s, slo.tpot_s, slo.e2e_s) == pytest.approx(expected) and bad is malformed


def test_a_header_sets_a_bound_the_configuration_left_out():
    slo, _ = request_slo(RequestSlo(ttft_s=None, tpot_s=0.1), b"300", None, "tighten")
    assert slo.ttft_s == 0.3


def test_the_llm_d_spelling_wins_over_the_older_one():
    headers = [(b"x-slo-ttft-ms", b"900"), (b"x-llm-d-slo-tpot-ms", b"20"), (b"x-llm-d-slo-ttft-ms", b"500")]
    assert slo_header_values(headers) == (b"500", b"20")
    assert slo_header_values([(b"x-slo-tpot-ms", b"7")]) == (None, b"7")
    assert slo_header_values([(b"authorization", b"x")]) == (None, None)


def test_a_bad_configured_bound_is_refused_naming_the_flag():
    with pytest.raises(ValueError, match="--goodput-slo 'fast' is not one of"):
        SidecarConfig(upstream="http://127.0.0.1:9", goodput_slo="fast")
    with pytest.raises(ValueError, match="--goodput-headers"):
        SidecarConfig(upstream="http://127.0.0.1:9", goodput_headers="maybe")  # type: ignore[arg-type]
    config = SidecarConfig(upstream="http://127.0.0.1:9", goodput_slo="mlperf-server", goodput_ttft_s=0.5)
    assert config.request_slo() == RequestSlo(ttft_s=0.5, tpot_s=0.1)
    assert SidecarConfig(upstream="http://127.0.0.1:9", goodput_tpot_s=0).request_slo().tpot_s is None


# --- through a real sidecar -------------------------------------------------------------------


def _send(rig: Rig, client: httpx.Client, mode: str = "ok", stream: bool = True, **headers: str) -> int:
    body = {**CHAT, "stream": stream}
    response = client.post(rig.url + "/v1/chat/completions", json=body, headers={"x-fake": mode, **headers})
    return response.status_code


def _verdicts(rig: Rig) -> dict[str, float]:
    return {
        dict(labels)["verdict"]: value
        for (name, labels), value in rig.metrics().items()
        if name == "headroom_slo_requests_total"
    }


def _recomputed(rows: list[dict]) -> Counter[str]:
    """Each row's verdict again, from its own times, outcome and the bounds stored beside them."""
    return Counter(
        verdict(
            row["outcome"],
            row["stream"],
            ttft_s=row["ttft_s"],
            tpot_s=row["tpot_s"],
            e2e_s=row["e2e_s"],
            slo=RequestSlo(row["slo_ttft_s"], row["slo_tpot_s"], row["slo_e2e_s"]),
        )
        for row in rows
    )


@pytest.mark.slow
def test_goodput_from_metrics_equals_goodput_recomputed_from_the_log_exactly(tmp_path):
    """A mixed workload: fast answers, latency misses, SLO headers of both spellings (narrowing,
    a widening one refused, a malformed one), 429s, 503s, a 500, a reset, a 400, a client that
    left, a non-streamed answer. Every verdict and the good tokens on /metrics equal the log's."""
    with (
        sidecar_rig(tmp_path, goodput_ttft_s=0.25, goodput_tpot_s=0.5) as rig,
        httpx.Client(timeout=patient(10)) as client,
    ):
        slow = {"x-fake-delay": "0.4"}  # TTFT >= 0.4 s: past the 0.25 s bound
        for _ in range(4):
            assert _send(rig, client) == 200
        assert _send(rig, client, stream=False) == 200
        for _ in range(2):
            assert _send(rig, client, **slow) == 200
        assert _send(rig, client, **{"x-fake-delay": "0.05", "x-llm-d-slo-ttft-ms": "20"}) == 200
        assert _send(rig, client, **{"x-fake-delay": "0.05", "x-slo-ttft-ms": "20"}) == 200
        assert _send(rig, client, **slow, **{"x-slo-ttft-ms": "5000"}) == 200  # may not widen it
        assert _send(rig, client, **{"x-llm-d-slo-ttft-ms": "soon"}) == 200  # ignored: configured
        for status in ("429", "429", "503", "503", "500", "400"):
            assert _send(rig, client, status) == int(status)
        with pytest.raises(httpx.HTTPError):  # reset after two tokens: the stream breaks
            _send(rig, client, "reset")
        with pytest.raises(httpx.ReadTimeout):  # the client leaves
            client.post(rig.url + "/v1/chat/completions", json=CHAT, headers={"x-fake": "hang"}, timeout=0.3)
        wait_until(lambda: len(rig.rows()) == 19, what="a row for each of the 19 requests")
        rows = rig.rows()
        exported = _verdicts(rig)
        metrics = rig.metrics()
    stored = Counter(row["verdict"] for row in rows)
    assert stored == _recomputed(rows)  # the stored verdict is the rule over the stored values
    assert exported == {name: float(count) for name, count in stored.items()}  # /metrics == the log
    assert stored["shed"] == 4 and stored["error"] == 2 and stored["invalid"] == 1 and stored["aborted"] == 1
    assert stored["missed"] >= 5  # two slow, two narrowed by headers, one that could not widen
    assert stored["met"] + stored["missed"] == 11 and set(stored) <= set(VERDICTS)
    narrowed = [row for row in rows if row["slo_ttft_s"] == pytest.approx(0.02)]
    assert len(narrowed) == 2 and all(row["verdict"] == "missed" for row in narrowed)
    assert all(row["slo_ttft_s"] in (0.25, pytest.approx(0.02)) for row in rows)  # 5000 ms never widened it
    assert metrics[("headroom_slo_headers_ignored_total", ())] == 1
    good_tokens = sum(row["completion_tokens"] for row in rows if row["verdict"] == "met")
    assert (
        metrics[("headroom_slo_good_tokens_total", (("model", "m1"), ("tenant", "anonymous")))] == good_tokens
    )
    per_task = Counter()
    for (name, labels), value in metrics.items():
        if name == "headroom_task_slo_requests_total":
            per_task[dict(labels)["verdict"]] += int(value)
    assert per_task == stored  # per task class: the same requests, summed


@pytest.mark.slow
def test_shedding_half_the_requests_lowers_attainment_never_raises_it(tmp_path):
    """The pitfall goodput must not fall into (arXiv 2410.14257): shedding load keeps the admitted
    requests fast, so the latency of what was answered looks perfect; attainment counts each shed
    request as a miss, so every shed lowers it and the window's attainment is what was served."""
    with sidecar_rig(tmp_path) as rig, httpx.Client(timeout=patient(10)) as client:
        for _ in range(10):
            assert _send(rig, client) == 200
        before = _verdicts(rig)
        attainments = [1.0]
        for index in range(10):
            assert _send(rig, client, "503" if index % 2 == 0 else "ok") in (200, 503)
            counts = _verdicts(rig)
            attainments.append(counts.get("met", 0) / sum(v for k, v in counts.items() if k != "invalid"))
    assert before == {"met": 10.0}
    for index in range(10):  # each shed request lowered it; an answered one never lowered it
        earlier, later = attainments[index], attainments[index + 1]
        assert later < earlier if index % 2 == 0 else later >= earlier, (index, attainments)
    assert counts == {"met": 15.0, "shed": 5.0} and attainments[-1] == pytest.approx(15 / 20)
    # of the second window alone, half: what was served, although every answer met its latency SLO
    assert (counts["met"] - before["met"]) / 10 == 0.5
