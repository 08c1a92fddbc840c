"""Background polling of an engine's /metrics: keeps `.latest`, exports the normalised gauges.

The poller is an asyncio task on the sidecar's event loop. Each poll is bounded by `timeout_s`
(connect, read and parse together) and parsing runs in a worker thread, so an engine that hangs,
trickles bytes or returns megabytes of garbage never holds the loop that proxies requests; it
only turns `headroom_engine_up` to 0 and the snapshot's values to None (unknown).

The engine series carry the served model: the engine's own model label where its metrics have
one (vLLM, SGLang), else the one model its `GET /v1/models` lists (llama.cpp, TGI, a generic
mapping without `model_label`), asked once when the engine comes up and then at most once a
minute until it answers; `model` (`headroom run --model`) names it whatever the engine says.
With `learn_adapters`, `adapter_parents` is what that list says of LoRA adapters ({adapter: base
model}, vLLM's `parent`), asked once a minute while the engine is up and kept while it is down.

`collect()` builds fresh metric families per scrape from the last snapshot, with HELP text from
the catalog ("as of the last poll"); `last_scrape` is how that poll went, which
collector.sources.health.SourceHealth exports as headroom_source_scrape_*{source="engine"}, and
`integrity` (collector.sources.integrity) whether each signal can be trusted, exported there as
headroom_signal_valid{source="engine"}.

The pages are read with an httpx.AsyncClient: the poller's own (at most 2 connections, made at
`start()`, closed at `stop()`), or one the caller passes in and closes. httpx is imported only when
a poller starts, so a sidecar that polls no engine never loads an HTTP client library for it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from collector.catalog import spec
from collector.sources.base import EngineSnapshot
from collector.sources.health import ScrapeHealth
from collector.sources.integrity import SignalIntegrity
from collector.sources.served import MAX_MODEL_CHARS, adapter_parents, served_model

if TYPE_CHECKING:  # imported at start(): a sidecar with --engine none never loads httpx
    import httpx

__all__ = ["EngineSource", "Fetch", "Scrape", "ScrapeError", "MAX_EXPOSITION_BYTES", "MODEL_RETRY_S"]

log = logging.getLogger(__name__)

MAX_EXPOSITION_BYTES = 16 * 1024 * 1024  # vLLM with many LoRAs is ~1 MB; more is not metrics
Fetch = Callable[[str], Awaitable[str]]
Scrape = Callable[[Fetch], Awaitable[EngineSnapshot]]
MODEL_RETRY_S = 60.0  # while /v1/models names no model, ask again at most this often
_CONNECTIONS = 2  # llama.cpp's /metrics and /slots are read at once
_KEEPALIVE_S = 15.0  # an idle connection is kept this long, then closed
_CHUNK = 65536


class ScrapeError(RuntimeError):
    """The engine's endpoint could not be read (no connection, a broken answer), or answered with
    something we cannot use (not HTTP 200, too large)."""


class EngineSource:
    """Polls one engine in the background; `.latest` is always a snapshot (maybe a down one)."""

    def __init__(
        self,
        engine: str,
        scrape: Scrape,
        *,
        poll_interval_s: float = 1.0,
        timeout_s: float = 2.0,
        source: str = "engine",
        model: str | None = None,
        models_url: str | None = None,
        learn_adapters: bool = False,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        if poll_interval_s <= 0 or timeout_s <= 0:
            raise ValueError(
                f"poll interval ({poll_interval_s}) and timeout ({timeout_s}) must be positive seconds"
            )
        if model is not None and not model.strip():
            raise ValueError("--model is empty; give the model name clients send, or leave it out")
        self.engine = engine
        self.model = model[:MAX_MODEL_CHARS] if model else None  # --model: beats what the engine says
        self.models_url = models_url  # GET /v1/models, for engines whose metrics name no model
        self._served: str | None = None  # what models_url named
        self._asked_at: float | None = None  # monotonic time of the last /v1/models question
        self.adapter_parents: dict[str, str] = {}  # /v1/models: each LoRA adapter's base model
        self._adapters_asked_at: float | None = None
        self._learn = learn_adapters  # ask models_url for adapter_parents (the sidecar does)
        self.poll_interval_s = poll_interval_s
        self.timeout_s = timeout_s
        self.source = source
        self.latest = EngineSnapshot.down(engine, "not polled yet")
        # headroom_signal_valid: judged after each poll; the sidecar hands it its traffic
        self.integrity = SignalIntegrity()
        self.last_duration_s: float | None = None
        self.polls = 0
        self._scrape = scrape
        self._shared = client  # the caller's: used from start() on, never closed here
        self._client: httpx.AsyncClient | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping: asyncio.Event | None = None

    async def start(self) -> None:
        """Start polling in the background; returns at once (the first poll runs in the task)."""
        if self._task is not None:
            return
        self._client = self._shared if self._shared is not None else _new_client(self.timeout_s)
        self._stopping = stopping = asyncio.Event()  # made here: it belongs to the loop that runs it
        self._task = asyncio.create_task(self._run(stopping), name=f"headroom-engine-{self.engine}")

    async def stop(self) -> None:
        """Stop polling and close the HTTP client; safe to call twice or without start()."""
        if self._task is not None:
            if self._stopping is not None:
                self._stopping.set()
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        if self._client is not None:
            if self._client is not self._shared:
                await self._client.aclose()
            self._client = None

    async def _run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            started = time.monotonic()
            await self.poll_once()
            delay = max(0.0, self.poll_interval_s - (time.monotonic() - started))
            try:
                await asyncio.wait_for(stopping.wait(), timeout=delay)
            except TimeoutError:
                pass

    async def poll_once(self) -> EngineSnapshot:
        """One bounded poll: updates `.latest`, never raises (a failure is a down snapshot).

        The snapshot's polled_at is when the poll was sent: what it reports is the engine's
        state from then on, so a reader can tell a snapshot older than the moment it cares
        about (the probe's level start) even when the answer arrived after that moment.
        """
        sent_at, started = time.time(), time.perf_counter()
        try:
            async with asyncio.timeout(self.timeout_s):
                snapshot = await self._scrape(self._fetch)
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            snapshot = EngineSnapshot.down(self.engine, f"no answer within {self.timeout_s:g} s")
        except Exception as exc:  # any failure of the engine must only mark it down
            snapshot = EngineSnapshot.down(self.engine, _short(exc))
        if snapshot.up:
            snapshot = await self._named(snapshot)
            await self._learn_adapters()
        self.last_duration_s = time.perf_counter() - started
        snapshot = replace(snapshot, polled_at=sent_at)
        self.polls += 1
        if snapshot.up:
            self.engine = snapshot.engine  # `auto` learns its engine's name here
        self._log_transition(snapshot)
        self.latest = snapshot
        self.integrity.observe(snapshot)
        return snapshot

    async def _named(self, snapshot: EngineSnapshot) -> EngineSnapshot:
        """The snapshot under the served model: --model, else the engine's label, else /v1/models."""
        if self.model is not None:
            return replace(snapshot, model=self.model)
        if snapshot.model or self.models_url is None:
            return snapshot
        if not self.latest.up:  # first answer, or the engine is back: maybe with another model
            self._served, self._asked_at = None, None
        now = time.monotonic()
        if self._served is None and (self._asked_at is None or now - self._asked_at >= MODEL_RETRY_S):
            first = self._asked_at is None
            self._asked_at = now
            try:
                async with asyncio.timeout(self.timeout_s):
                    self._served = served_model(json.loads(await self._fetch(self.models_url)))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the model is optional: the engine's figures stay up
                level = logging.WARNING if first else logging.DEBUG
                why = "no answer in time" if isinstance(exc, TimeoutError) else _short(exc)
                log.log(
                    level,
                    'engine %s: model unknown (%s); its series carry model="" until /v1/models '
                    "names one model, or pass --model",
                    self.engine,
                    why,
                )
        return replace(snapshot, model=self._served) if self._served else snapshot

    async def _learn_adapters(self) -> None:
        """Refresh `adapter_parents` from /v1/models, at most once every MODEL_RETRY_S."""
        now = time.monotonic()
        if (
            not self._learn
            or self.models_url is None
            or (self._adapters_asked_at is not None and now - self._adapters_asked_at < MODEL_RETRY_S)
        ):
            return
        self._adapters_asked_at = now
        try:
            async with asyncio.timeout(self.timeout_s):
                self.adapter_parents = adapter_parents(json.loads(await self._fetch(self.models_url)))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # adapters are optional: keep what was known
            log.debug("engine %s: adapters not read from /v1/models: %s", self.engine, _short(exc))

    async def _fetch(self, url: str) -> str:
        """GET url as text, refusing non-200 answers and pages over MAX_EXPOSITION_BYTES.

        Bounded by timeout_s in all (connect, wait, read); past it, or on any of httpx's own
        timeouts, raises TimeoutError. Any other failure to read the page is a ScrapeError.
        """
        if self._client is None:
            raise ScrapeError("engine source is not started; call start() first")
        import httpx  # loaded already (start() made or got the client): for its exceptions

        try:
            async with (
                asyncio.timeout(self.timeout_s),
                self._client.stream("GET", url, timeout=self.timeout_s, follow_redirects=True) as response,
            ):
                if response.status_code != 200:
                    raise ScrapeError(f"{url} answered HTTP {response.status_code}")
                chunks, size = [], 0
                async for chunk in response.aiter_bytes(_CHUNK):
                    size += len(chunk)
                    if size > MAX_EXPOSITION_BYTES:
                        raise ScrapeError(f"{url} sent more than {MAX_EXPOSITION_BYTES} bytes")
                    chunks.append(chunk)
        except httpx.TimeoutException as exc:
            raise TimeoutError(f"{url}: no answer within {self.timeout_s:g} s") from exc
        except (httpx.HTTPError, httpx.InvalidURL) as exc:  # no connection, a broken answer, a bad URL
            raise ScrapeError(f"{url}: {_short(exc)}") from exc
        return b"".join(chunks).decode("utf-8", errors="replace")

    def _log_transition(self, snapshot: EngineSnapshot) -> None:
        if self.latest.up and not snapshot.up:
            log.warning("engine %s went down: %s", self.engine, snapshot.error)
        elif not self.latest.up and snapshot.up:
            log.info("engine %s is up (%s)", snapshot.engine, snapshot.model or "model unknown")
        elif self.polls == 1 and not snapshot.up:
            log.warning("engine %s is not answering: %s", self.engine, snapshot.error)

    @property
    def last_scrape(self) -> ScrapeHealth:
        """How the latest poll went: the engine answered usably, and how long it took."""
        return ScrapeHealth(self.latest.up, self.last_duration_s)

    def collect(self) -> list[Metric]:
        """Fresh headroom_engine_* families from the last snapshot (prometheus-client custom collector)."""
        return engine_families(self.latest)


def _new_client(timeout_s: float) -> httpx.AsyncClient:
    """The poller's own client: at most _CONNECTIONS connections, redirects followed, nothing taken
    from the environment (no HTTP(S)_PROXY, no .netrc), the system's CA certificates for https."""
    import httpx  # here, not at the top: only a sidecar that polls an engine loads httpx

    return httpx.AsyncClient(
        timeout=httpx.Timeout(timeout_s),
        limits=httpx.Limits(
            max_connections=_CONNECTIONS,
            max_keepalive_connections=_CONNECTIONS,
            keepalive_expiry=_KEEPALIVE_S,
        ),
        follow_redirects=True,
        trust_env=False,
        verify=ssl.create_default_context(),
    )


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _gauge(name: str, labels: tuple[str, ...] | None = None) -> GaugeMetricFamily:
    entry = spec(name)
    return GaugeMetricFamily(name, entry.help, labels=list(labels or entry.labels))


def engine_families(snapshot: EngineSnapshot) -> list[Metric]:
    """The headroom_engine_* families for one snapshot."""
    up = _gauge("headroom_engine_up")
    up.add_metric([snapshot.engine], 1.0 if snapshot.up else 0.0)
    families: list[Metric] = [up]
    labels = [snapshot.engine, snapshot.model or ""]
    for name, value in (
        ("headroom_engine_requests_running", snapshot.running),
        ("headroom_engine_requests_waiting", snapshot.waiting),
        ("headroom_engine_kv_cache_usage_ratio", snapshot.kv_usage_ratio),
        ("headroom_engine_kv_cache_capacity_tokens", snapshot.kv_capacity_tokens),
        ("headroom_engine_max_concurrency_requests", snapshot.max_concurrency),
    ):
        if value is not None:  # unknown is absent, never a fake zero
            family = _gauge(name)
            family.add_metric(labels, float(value))
            families.append(family)
    for name, total in (
        ("headroom_engine_preemptions_total", snapshot.preemptions_total),
        ("headroom_engine_prefix_cache_queries_total", snapshot.prefix_cache_queries_total),
        ("headroom_engine_prefix_cache_hits_total", snapshot.prefix_cache_hits_total),
    ):
        if total is not None:  # the engine's own count, relayed: it resets when the engine restarts
            counter = CounterMetricFamily(name, spec(name).help, labels=list(spec(name).labels))
            counter.add_metric(labels, total)
            families.append(counter)
    return families
