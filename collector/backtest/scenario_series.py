"""Everything a simulated fleet exports: the sidecar's series plus its engine, GPU, capacity and log.

The sidecar's request series come from collector.backtest.exposition (the same code replays a
request log); this module adds what only the simulation knows, each the way the sidecar exports it:

    headroom_engine_up{engine}             0 while the engine's /metrics fails or the engine is gone
    headroom_engine_requests_running, _waiting, headroom_engine_kv_cache_usage_ratio,
    headroom_engine_kv_cache_capacity_tokens, headroom_engine_max_concurrency_requests  {engine, model}
                                           absent while the engine is down (unknown, never zero)
    headroom_gpu_up, headroom_gpu_utilization_ratio{gpu, uuid, gpu_name}   share of the interval computing
    headroom_capacity_*{model, task_class="all", source="probe", confidence="high"}   the published knee
    headroom_adapter_slots{model}          the engine's adapter slots (max_loras), once an adapter request came
    headroom_log_rows_written_total, headroom_log_queue_rows
    with a log sink that fails (a log_sink_outage fault: the lake away): headroom_log_sink_up, headroom_log_spool_files, _bytes,
    _oldest_age_seconds, headroom_log_sink_lag_seconds

and then applies the scrape faults: `sidecar_down` leaves `up` 0 and nothing else, `sidecar_gone`
leaves nothing at all. A replica in a cluster carries `cluster=<name>` on every one of its series.
"""

from __future__ import annotations

from collections import deque

from collector.backtest.exposition import GoodputSlo, scrape_times, sidecar_series, target_labels
from collector.backtest.lifecycle import Lifecycle
from collector.backtest.openmetrics import SeriesKey, SeriesSet
from collector.backtest.scenario import Replica, Scenario
from collector.backtest.simulate import EngineSample, SimulationResult

__all__ = ["scenario_series", "SPOOL_ROW_BYTES", "DRAIN_ROWS_PER_S"]

ENGINE = "vllm"
SPOOL_ROW_BYTES = 400  # a request-log row in the spool, roughly
DRAIN_ROWS_PER_S = 2000.0  # how fast a spool drains once the sink takes rows again
_FLUSH_S = 0.5  # the writer's flush interval: one spool file per flush with rows


def _engine(
    out: SeriesSet,
    target: dict[str, str],
    samples: list[EngineSample],
    scenario: Scenario,
    replica: Replica,
    epoch: float,
) -> None:
    labels = target | {"engine": ENGINE, "model": scenario.model}
    config = replica.engine
    capacity = config.num_blocks * config.block_size
    for sample in samples:
        down = any(
            f.covers(sample.t - epoch, replica.instance)
            for f in scenario.faults
            if f.kind in ("engine_metrics_down", "engine_outage")
        )
        out.add("headroom_engine_up", target | {"engine": ENGINE}, sample.t, 0.0 if down else 1.0)
        out.add(
            "headroom_source_scrape_success", target | {"source": "engine"}, sample.t, 0.0 if down else 1.0
        )
        gpu = target | {"gpu": "0", "uuid": f"GPU-{replica.instance}", "gpu_name": "simulated"}
        out.add("headroom_gpu_up", gpu, sample.t, 1.0)
        out.add("headroom_gpu_utilization_ratio", gpu, sample.t, sample.busy_ratio)
        if down:
            continue
        for name, value in (
            ("headroom_engine_requests_running", sample.running),
            ("headroom_engine_requests_waiting", sample.waiting),
            ("headroom_engine_kv_cache_usage_ratio", sample.kv_usage_ratio),
            ("headroom_engine_kv_cache_capacity_tokens", capacity),
            ("headroom_engine_max_concurrency_requests", capacity // config.max_model_len),
        ):
            out.add(name, labels, sample.t, value)


def _adapter_slots(
    out: SeriesSet,
    target: dict[str, str],
    times: list[float],
    records: list[Lifecycle],
    replica: Replica,
    model: str,
) -> None:
    """The engine's adapter slots, from the first request that named an adapter (as the sidecar)."""
    first = min((r.admitted for r in records if r.adapter is not None), default=None)
    if first is None:
        return
    labels = target | {"model": model}
    for t in times:
        if t >= first:
            out.add("headroom_adapter_slots", labels, t, float(replica.engine.max_loras))


def _capacity(
    out: SeriesSet, target: dict[str, str], times: list[float], scenario: Scenario, epoch: float
) -> None:
    labels = target | {"model": scenario.model, "task_class": "all", "source": "probe", "confidence": "high"}
    values: dict[str, float] = {
        "headroom_capacity_knee_requests": scenario.knee_requests,
        "headroom_capacity_recommended_pool_requests": scenario.recommended_pool,
        "headroom_capacity_estimate_timestamp_seconds": epoch - 86400,
    }
    if scenario.knee_tokens is not None:  # simulate() derives it where the scenario leaves it open
        values["headroom_capacity_knee_tokens"] = scenario.knee_tokens
    for t in times:
        for name, value in values.items():
            out.add(name, labels, t, value)


def _log(
    out: SeriesSet,
    target: dict[str, str],
    times: list[float],
    records: list[Lifecycle],
    scenario: Scenario,
    instance: str,
    epoch: float,
) -> None:
    """Rows written (or spooled and drained while a log_sink_outage keeps the sink away)."""
    done = sorted(r.completed for r in records if r.completed is not None)
    outages = [f for f in scenario.faults_of("log_sink_outage") if f.instance in (None, instance)]
    spooling = bool(outages)
    spool: deque[float] = deque()  # completion times of spooled rows, oldest first
    files: set[int] = set()  # flush slots that produced a spool file
    written = 0.0
    index, last = 0, times[0]
    for t in times:
        sink_down = any(f.covers(t - epoch, instance) for f in outages)
        while index < len(done) and done[index] <= t:
            if sink_down or spool:
                spool.append(done[index])
                files.add(int(done[index] / _FLUSH_S))
            else:
                written += 1
            index += 1
        if not sink_down:  # the spool drains, oldest first
            for _ in range(min(len(spool), int(DRAIN_ROWS_PER_S * (t - last)))):
                spool.popleft()
                written += 1
            if not spool:
                files.clear()
        last = t
        out.add("headroom_log_rows_written_total", target, t, written)
        out.add("headroom_log_queue_rows", target, t, 0.0)
        if spooling:
            oldest = t - spool[0] if spool else 0.0
            out.add("headroom_log_sink_up", target, t, 0.0 if sink_down else 1.0)
            out.add("headroom_log_spool_files", target, t, float(len(files)))
            out.add("headroom_log_spool_bytes", target, t, float(len(spool) * SPOOL_ROW_BYTES))
            out.add("headroom_log_spool_oldest_age_seconds", target, t, oldest)
            out.add("headroom_log_sink_lag_seconds", target, t, oldest)


def _scrape_faults(out: SeriesSet, scenario: Scenario, epoch: float) -> None:
    windows = [f for f in scenario.faults if f.kind in ("sidecar_down", "sidecar_gone")]
    if not windows:
        return

    def change(key: SeriesKey, t: float, value: float) -> float | None:
        instance = dict(key[1]).get("instance", "")
        for fault in windows:
            if fault.covers(t - epoch, instance):
                return 0.0 if key[0] == "up" and fault.kind == "sidecar_down" else None
        return value

    out.transform(change)


def scenario_series(result: SimulationResult, job: str, slo_of: GoodputSlo | None = None) -> SeriesSet:
    """Every series the scenario's sidecars would have exported to Prometheus job `job`; `slo_of`
    judges goodput (exposition.goodput_slo of the rules config; default: the default rules')."""
    scenario, epoch = result.scenario, result.epoch
    times = scrape_times(epoch, result.end, scenario.scrape_interval_s)
    out = SeriesSet()
    targets = [(r.cluster, r.instance) for r in scenario.replicas]
    sidecar_series(result.records, times, job, out, targets, slo_of)
    for replica in scenario.replicas:
        target = target_labels(job, replica.instance, replica.cluster)
        records = [
            r for r in result.records if r.instance == replica.instance and r.cluster == replica.cluster
        ]
        _engine(out, target, result.engine[replica.key], scenario, replica, epoch)
        _capacity(out, target, times, scenario, epoch)
        _adapter_slots(out, target, times, records, replica, scenario.model)
        _log(out, target, times, records, scenario, replica.instance, epoch)
    _scrape_faults(out, scenario, epoch)
    return out
