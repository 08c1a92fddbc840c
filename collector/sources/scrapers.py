"""How each engine is scraped: fetch its page(s), parse off the event loop, return a snapshot.

A scraper is `async (fetch) -> EngineSnapshot`; the poller supplies `fetch` (bounded HTTP GET)
and the overall timeout. Parsing runs in a worker thread so a large page never stalls the loop.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from collector.sources.base import EngineSnapshot, ExpositionError, parse_exposition
from collector.sources.detect import detect_engine
from collector.sources.generic import GenericMapping, parse_generic
from collector.sources.headroom import parse_headroom
from collector.sources.llamacpp import parse_llamacpp, slots_url
from collector.sources.poller import Fetch, Scrape
from collector.sources.sglang import parse_sglang
from collector.sources.tgi import parse_tgi
from collector.sources.vllm import parse_vllm

__all__ = ["PARSERS", "text_scraper", "llamacpp_scraper", "generic_scraper", "auto_scraper"]

PARSERS: dict[str, Callable[[str], EngineSnapshot]] = {
    "vllm": parse_vllm,
    "sglang": parse_sglang,
    "tgi": parse_tgi,
    "llamacpp": parse_llamacpp,
    "headroom": parse_headroom,  # a sidecar's relayed engine figures (the probe through a sidecar)
}


def text_scraper(parse: Callable[[str], EngineSnapshot], metrics_url: str) -> Scrape:
    """Scrape one /metrics page and parse it with `parse`."""

    async def scrape(fetch: Fetch) -> EngineSnapshot:
        return await asyncio.to_thread(parse, await fetch(metrics_url))

    return scrape


async def _fetch_slots(fetch: Fetch, url: str) -> object:
    """The /slots JSON, or None when the server has it disabled or answers with junk."""
    try:
        return json.loads(await fetch(url))
    except Exception:  # any failure: /slots is optional, /metrics alone decides up or down
        return None


def llamacpp_scraper(metrics_url: str) -> Scrape:
    """Scrape llama-server /metrics and /slots together; /slots is optional."""
    slots_at = slots_url(metrics_url)

    async def scrape(fetch: Fetch) -> EngineSnapshot:
        slots_task = asyncio.ensure_future(_fetch_slots(fetch, slots_at))  # both in flight at once
        try:
            text = await fetch(metrics_url)
        except BaseException:
            slots_task.cancel()
            raise
        return await asyncio.to_thread(parse_llamacpp, text, await slots_task)

    return scrape


def generic_scraper(mapping: GenericMapping, metrics_url: str) -> Scrape:
    """Scrape any /metrics page through a YAML mapping."""
    return text_scraper(lambda text: parse_generic(text, mapping), metrics_url)


def auto_scraper(metrics_url: str) -> Scrape:
    """Recognise the engine on each poll until known, then scrape it as that engine.

    The poll that recognises it reads the page once: the snapshot comes from the page the engine
    was recognised by (and llama.cpp's /slots), so that poll fits the same timeout as any other
    and a slow engine is up from its first answer, not its second.
    """
    known: dict[str, Scrape] = {}

    async def scrape(fetch: Fetch) -> EngineSnapshot:
        if "engine" in known:
            return await known["engine"](fetch)
        text = await fetch(metrics_url)
        engine = detect_engine(await asyncio.to_thread(parse_exposition, text))
        if engine is None:
            raise ExpositionError(
                f"{metrics_url} shows no vllm, sglang, tgi or llamacpp metrics; "
                "pass --engine explicitly (or generic with a mapping)"
            )
        if engine == "llamacpp":
            known["engine"] = llamacpp_scraper(metrics_url)
            slots = await _fetch_slots(fetch, slots_url(metrics_url))
            return await asyncio.to_thread(parse_llamacpp, text, slots)
        known["engine"] = text_scraper(PARSERS[engine], metrics_url)
        return await asyncio.to_thread(PARSERS[engine], text)

    return scrape
