"""The series a sidecar exports, rebuilt at each scrape from request records (simulated or logged).

What Prometheus would have stored, scrape by scrape, for one `job`: `up`; both calibers per model
and tenant (in flight = admitted and not yet complete; active tokens = prompt + tokens generated so
far, growing linearly from the first token to completion, prompt only when not streamed, as the
tracker counts them), also per task class; requests, prompt and generated tokens by outcome; the TTFT, TPOT and
duration histograms, observed when a request completes (as the tracker does); and for requests
that named a LoRA adapter, the in-flight requests per adapter and the distinct adapters in flight
per base model (collector.sidecar.adapters: from the live set, queued and running). Goodput as the
sidecar counts it: each finished request's verdict (collector.goodput.verdict, from its outcome and
latencies) per tenant and per task class, and the generated tokens of the met ones; the SLO it is
judged by is the rules' (`goodput_slo`: the model's TTFT and e2e targets, no TPOT bound, as
`headroom run --goodput-tpot 0` with those targets), so attainment and the latency SLIs agree on
every request. Label sets appear
with their first request and stay, like prometheus_client's. A record with a cluster is exported
with the label `cluster` (its target is job, cluster and instance); without one, job and instance.

    series = SeriesSet()
    sidecar_series(records, scrape_times(t0, t0 + 60, 15), "headroom-sidecar", series)
    # -> headroom_inflight_requests{instance="replica-0",job="headroom-sidecar",model="m",tenant="a"}
    #    at t0, t0+15, ... t0+60; headroom_time_to_first_token_seconds_bucket{le="0.5",...} ...
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable, Iterable

from collector.backtest.lifecycle import Lifecycle
from collector.backtest.openmetrics import SeriesKey, SeriesSet
from collector.catalog import spec
from collector.goodput import RequestSlo, verdict
from collector.rules.config import DEFAULT, RulesConfig
from collector.rules.naming import le_label

__all__ = ["scrape_times", "sidecar_series", "target_labels", "goodput_slo", "HISTOGRAMS", "GoodputSlo"]

# model -> the SLO its requests are judged by for goodput
GoodputSlo = Callable[[str], RequestSlo]

# histogram -> the record's observed value (None: not observed, e.g. no TTFT without a stream)
HISTOGRAMS: dict[str, Callable[[Lifecycle], float | None]] = {
    "headroom_time_to_first_token_seconds": lambda r: r.ttft_s,
    "headroom_time_per_output_token_seconds": lambda r: r.tpot_s,
    "headroom_request_duration_seconds": lambda r: r.e2e_s,
}


def scrape_times(start: float, end: float, interval_s: float) -> list[float]:
    """start, start + interval, ... up to and including end: scrape_times(0, 30, 15) -> [0, 15, 30]."""
    count = int((end - start) / interval_s + 1e-9)
    return [start + i * interval_s for i in range(count + 1)]


def goodput_slo(config: RulesConfig = DEFAULT) -> GoodputSlo:
    """The SLO a backtest's sidecars judge goodput by: the rules' TTFT and e2e targets of each model.

    No TPOT bound: the rules have no TPOT SLO, and the backtest engine's 70B roofline decodes at
    about 0.1 s a token, on the sidecar's default 100 ms bound.

        goodput_slo()("llama-70b") -> RequestSlo(ttft_s=2.0, tpot_s=None, e2e_s=60.0)
    """

    def of(model: str) -> RequestSlo:
        slo = config.slo_for(model)
        return RequestSlo(ttft_s=slo.ttft_seconds, e2e_s=slo.e2e_seconds)

    return of


def target_labels(job: str, instance: str, cluster: str = "") -> dict[str, str]:
    """A sidecar's target labels: {"job", "instance"}, and "cluster" when it has one."""
    return {"job": job, "instance": instance} | ({"cluster": cluster} if cluster else {})


def _key(name: str, labels: dict[str, str]) -> SeriesKey:
    return name, tuple(sorted(labels.items()))


def active_tokens(record: Lifecycle, t: float) -> int:
    """Token-caliber weight of `record` at `t`: prompt, plus tokens streamed so far (linear in time).

    A streamed request of 100 prompt and 11 generated tokens, first token at 1 s, done at 3 s:
    at 2 s -> 100 + 1 + 10 * (2 - 1) / (3 - 1) = 106.
    """
    if not record.stream or record.first_token is None or t < record.first_token:
        return record.prompt_tokens
    if record.completed is None or record.completed <= record.first_token:
        return record.prompt_tokens + 1
    share = min(1.0, (t - record.first_token) / (record.completed - record.first_token))
    return record.prompt_tokens + 1 + int((max(1, record.completion_tokens) - 1) * share)


class _Histogram:
    """Cumulative buckets, sum and count of one histogram series, emitted whole at each scrape."""

    def __init__(self, name: str, labels: dict[str, str]) -> None:
        self.bounds = spec(name).buckets
        self.counts = [0] * (len(self.bounds) + 1)
        self.total, self.sum = 0, 0.0
        les = [le_label(b) for b in self.bounds] + ["+Inf"]
        self.bucket_keys = [_key(f"{name}_bucket", labels | {"le": le}) for le in les]
        self.sum_key, self.count_key = _key(f"{name}_sum", labels), _key(f"{name}_count", labels)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += 1
        self.sum += value

    def emit(self, out: SeriesSet, t: float) -> None:
        running = 0
        for key, count in zip(self.bucket_keys, self.counts):
            running += count
            out.add_key(key, t, float(running))
        out.add_key(self.sum_key, t, self.sum)
        out.add_key(self.count_key, t, float(self.total))


class _SidecarState:
    """One sidecar's counters, histograms and label sets, advanced request by request."""

    def __init__(self, target: dict[str, str], slo_of: GoodputSlo) -> None:
        self.target, self.slo_of = target, slo_of
        self.counters: dict[SeriesKey, float] = {}
        self.histograms: dict[tuple[str, str, str], _Histogram] = {}
        self.gauge_keys: dict[tuple[str, str], tuple[SeriesKey, SeriesKey]] = {}
        self.task_keys: dict[tuple[str, str], tuple[SeriesKey, SeriesKey]] = {}
        self.adapter_keys: dict[tuple[str, str], SeriesKey] = {}  # (model, adapter) -> in flight
        self.distinct_keys: dict[str, SeriesKey] = {}  # model -> distinct adapters in flight

    def admitted(self, record: Lifecycle) -> None:
        if record.adapter is not None:
            labels = self.target | {"model": record.model}
            self.adapter_keys.setdefault(
                (record.model, record.adapter),
                _key("headroom_adapter_inflight_requests", labels | {"adapter": record.adapter}),
            )
            self.distinct_keys.setdefault(record.model, _key("headroom_adapters_inflight", labels))
        task = (record.model, record.task_class)
        if task not in self.task_keys:
            labels = self.target | {"model": record.model, "task_class": record.task_class}
            self.task_keys[task] = (
                _key(spec("headroom_task_inflight_requests").name, labels),
                _key(spec("headroom_task_active_tokens").name, labels),
            )
        pair = (record.model, record.tenant)
        if pair not in self.gauge_keys:
            labels = self.target | {"model": record.model, "tenant": record.tenant}
            self.gauge_keys[pair] = (
                _key(spec("headroom_inflight_requests").name, labels),
                _key(spec("headroom_active_tokens").name, labels),
            )

    def finished(self, record: Lifecycle) -> None:
        per_request = self.target | {"model": record.model, "tenant": record.tenant}
        self._count("headroom_requests_total", per_request | {"outcome": record.outcome or "ok"}, 1)
        self._count("headroom_prompt_tokens_total", per_request, record.prompt_tokens)
        self._count("headroom_generated_tokens_total", per_request, record.completion_tokens)
        self._judge(record, per_request)
        for name, value_of in HISTOGRAMS.items():
            value = value_of(record)
            if value is None:
                continue
            extra = (record.outcome or "ok") if name == "headroom_request_duration_seconds" else ""
            histogram = self.histograms.get((name, record.model, extra))
            if histogram is None:
                labels = self.target | {"model": record.model} | ({"outcome": extra} if extra else {})
                histogram = self.histograms[(name, record.model, extra)] = _Histogram(name, labels)
            histogram.observe(value)

    def _judge(self, record: Lifecycle, per_request: dict[str, str]) -> None:
        """Goodput: the request's verdict per tenant and task class, its tokens when met."""
        judged = verdict(
            record.outcome or "ok",
            record.stream,
            ttft_s=record.ttft_s,
            tpot_s=record.tpot_s,
            e2e_s=record.e2e_s,
            slo=self.slo_of(record.model),
        )
        per_task = self.target | {"model": record.model, "task_class": record.task_class}
        self._count("headroom_slo_requests_total", per_request | {"verdict": judged}, 1)
        self._count("headroom_task_slo_requests_total", per_task | {"verdict": judged}, 1)
        if judged == "met":
            self._count("headroom_slo_good_tokens_total", per_request, record.completion_tokens)

    def _count(self, name: str, labels: dict[str, str], amount: float) -> None:
        key = _key(name, labels)
        self.counters[key] = self.counters.get(key, 0.0) + amount

    def emit(self, out: SeriesSet, t: float, live: dict[str, Lifecycle]) -> None:
        counts: dict[tuple[str, str], int] = defaultdict(int)
        weights: dict[tuple[str, str], int] = defaultdict(int)
        task_counts: dict[tuple[str, str], int] = defaultdict(int)
        task_weights: dict[tuple[str, str], int] = defaultdict(int)
        for record in live.values():
            tokens = active_tokens(record, t)
            counts[(record.model, record.tenant)] += 1
            weights[(record.model, record.tenant)] += tokens
            task_counts[(record.model, record.task_class)] += 1
            task_weights[(record.model, record.task_class)] += tokens
        for keys, count_of, weight_of in (
            (self.gauge_keys, counts, weights),
            (self.task_keys, task_counts, task_weights),
        ):
            for pair, (inflight_key, tokens_key) in keys.items():
                out.add_key(inflight_key, t, float(count_of.get(pair, 0)))
                out.add_key(tokens_key, t, float(weight_of.get(pair, 0)))
        self._emit_adapters(out, t, live)
        for key, value in self.counters.items():
            out.add_key(key, t, value)
        for histogram in self.histograms.values():
            histogram.emit(out, t)

    def _emit_adapters(self, out: SeriesSet, t: float, live: dict[str, Lifecycle]) -> None:
        """In flight per (model, adapter) and distinct adapters per model, 0 when none is live."""
        if not self.adapter_keys:
            return
        counts: dict[tuple[str, str], int] = defaultdict(int)
        for record in live.values():
            if record.adapter is not None:
                counts[(record.model, record.adapter)] += 1
        for pair, key in self.adapter_keys.items():
            out.add_key(key, t, float(counts.get(pair, 0)))
        for model, key in self.distinct_keys.items():
            out.add_key(key, t, float(sum(1 for m, _ in counts if m == model)))


def _instance_series(
    records: list[Lifecycle], times: list[float], target: dict[str, str], out: SeriesSet, slo_of: GoodputSlo
) -> None:
    admitted = sorted(records, key=lambda r: r.admitted)
    finished = sorted(
        ((r.completed, r) for r in records if r.completed is not None), key=lambda pair: pair[0]
    )
    state, live = _SidecarState(target, slo_of), dict[str, Lifecycle]()
    next_admit = next_finish = 0
    up_key = _key("up", target)
    for t in times:
        while next_admit < len(admitted) and admitted[next_admit].admitted <= t:
            record = admitted[next_admit]
            live[record.request_id] = record
            state.admitted(record)
            next_admit += 1
        while next_finish < len(finished) and finished[next_finish][0] <= t:
            record = finished[next_finish][1]
            live.pop(record.request_id, None)
            state.finished(record)
            next_finish += 1
        out.add_key(up_key, t, 1.0)
        state.emit(out, t, live)


def sidecar_series(
    records: list[Lifecycle],
    times: list[float],
    job: str,
    out: SeriesSet,
    targets: Iterable[tuple[str, str]] = (),
    slo_of: GoodputSlo | None = None,
) -> None:
    """Add every sidecar's request series (and `up`) to `out`.

    One sidecar per (cluster, instance) of the records, and one per pair of `targets` even without
    records ("" as the cluster: no cluster label). `slo_of` judges goodput (default: the default
    rules' SLO, `goodput_slo()`).
    """
    judge = slo_of or goodput_slo()
    by_target: dict[tuple[str, str], list[Lifecycle]] = {target: [] for target in targets}
    for record in records:
        by_target.setdefault((record.cluster, record.instance), []).append(record)
    for cluster, instance in sorted(by_target):
        target = target_labels(job, instance, cluster)
        _instance_series(by_target[(cluster, instance)], times, target, out, judge)
