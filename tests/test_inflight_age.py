"""The age of what is in flight (#39 item 1): computed from the live set at scrape time.

- a request held by a hanging upstream shows headroom_inflight_oldest_age_seconds growing in a real
  sidecar's /metrics, and climbs through headroom_inflight_older_than_requests' bounds;
- the unit: ages per (model, task class), bounds per model, 0 once the request leaves, and every
  label set ever seen keeps exporting (no vanished series).
"""

from __future__ import annotations

import threading
import time

import httpx
from prometheus_client import CollectorRegistry
from support.sidecar import CHAT, sidecar_rig, wait_until
from support.waiting import patient

from collector.catalog import INFLIGHT_AGE_BOUNDS
from collector.sidecar.live import LiveRequest
from collector.sidecar.tracker import Tracker


def _oldest(metrics: dict, model: str) -> float | None:
    values = [
        value
        for (name, labels), value in metrics.items()
        if name == "headroom_inflight_oldest_age_seconds" and dict(labels).get("model") == model
    ]
    return max(values) if values else None


def _older_than(metrics: dict, model: str) -> dict[str, float]:
    return {
        dict(labels)["older_than"]: value
        for (name, labels), value in metrics.items()
        if name == "headroom_inflight_older_than_requests" and dict(labels).get("model") == model
    }


def test_a_request_held_by_a_hanging_upstream_shows_its_age_growing_in_metrics(tmp_path):
    with sidecar_rig(tmp_path, engine="none") as rig:
        arrived = rig.upstream.expect("held")
        errors: list[BaseException] = []

        def send() -> None:
            try:
                httpx.post(
                    rig.url + "/v1/chat/completions",
                    json=CHAT,
                    headers={"x-fake": "hang", "x-test-id": "held"},
                    timeout=httpx.Timeout(30.0, read=8.0),  # ends the hold: not stretched
                )
            except httpx.HTTPError as exc:  # the read timeout ends the held request
                errors.append(exc)

        client = threading.Thread(target=send)
        client.start()
        assert arrived.wait(patient(10)), "the upstream never saw the request"
        first = wait_until(lambda: _oldest(rig.metrics(), "m1"), what="an age for m1")
        # the age grows with the wall clock while the upstream holds the request ...
        second = wait_until(
            lambda: (value := _oldest(rig.metrics(), "m1")) and value > first + 1.0 and value,
            timeout_s=8,
            what="the age to grow by a second",
        )
        assert second > first + 1.0
        bounds = _older_than(rig.metrics(), "m1")
        assert set(bounds) == {label for label, _ in INFLIGHT_AGE_BOUNDS}
        assert bounds["1s"] == 1 and bounds["10m"] == 0  # ... and it passed the first bound only
        client.join(patient(20))
        assert errors, "the hanging upstream answered"
        # the request left the live set: its age series stays, at 0
        wait_until(lambda: _oldest(rig.metrics(), "m1") == 0.0, what="the age back to 0")
        assert _older_than(rig.metrics(), "m1")["1s"] == 0


def _request(model: str, max_tokens: int | None) -> LiveRequest:
    return LiveRequest(model, "t", "/v1/chat/completions", True, max_tokens, 10)


def test_ages_per_model_and_task_class_and_bounds_per_model():
    tracker = Tracker(CollectorRegistry(), instance="i")
    old, young, other = _request("a", 50), _request("a", 2000), _request("b", None)
    for request in (old, young, other):
        tracker.admit(request)
    now = time.monotonic()
    old.admitted_mono, young.admitted_mono, other.admitted_mono = now - 700, now - 3, now - 0.5
    families = {family.name: family for family in tracker.exported.collect()}
    oldest = {
        tuple(s.labels.values()): s.value for s in families["headroom_inflight_oldest_age_seconds"].samples
    }
    assert 700 <= oldest[("a", "short")] < 710 and 3 <= oldest[("a", "long")] < 13
    assert 0.5 <= oldest[("b", "unspecified")] < 10
    older = {
        tuple(s.labels.values()): s.value for s in families["headroom_inflight_older_than_requests"].samples
    }
    assert [older[("a", label)] for label, _ in INFLIGHT_AGE_BOUNDS] == [2, 1, 1, 1, 1]
    assert [older[("b", label)] for label, _ in INFLIGHT_AGE_BOUNDS] == [0, 0, 0, 0, 0]
    tracker.finish(old, "ok")
    text = tracker.exported.text()
    assert 'headroom_inflight_oldest_age_seconds{model="a",task_class="short"} 0.0' in text
    assert 'headroom_inflight_older_than_requests{model="a",older_than="10m"} 0.0' in text
    assert 'headroom_inflight_older_than_requests{model="a",older_than="1s"} 1.0' in text


def test_before_any_request_one_age_series_exports_zero():
    text = Tracker(CollectorRegistry(), instance="i").exported.text()
    assert 'headroom_inflight_oldest_age_seconds{model="",task_class=""} 0.0' in text
    assert 'headroom_inflight_older_than_requests{model="",older_than="5s"} 0.0' in text
