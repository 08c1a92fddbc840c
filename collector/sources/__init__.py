"""Engine and GPU sources: each engine's own /metrics and NVML, in one normalised vocabulary.

    source = build_engine_source("vllm", "http://127.0.0.1:8000/metrics", 1.0)
    await source.start()          # background polling; source.latest is the last snapshot
    source.latest.waiting, source.latest.kv_usage_ratio, source.latest.model
    registry.register(SourceHealth([source, GpuCollector()]))
                                  # headroom_engine_*, headroom_gpu_*, headroom_source_scrape_*{source}

One module per engine (vllm, sglang, tgi, llamacpp, generic), each with a pure parse function;
`detect` for `--engine auto`, `poller` for the background loop, `served` for the model an engine
serves when its metrics do not label it (`/v1/models`), `gpu` for NVML, `health` for the one
collector that adds every source's scrape success and duration.
"""

from __future__ import annotations

from pathlib import Path

from collector.sources import scrapers
from collector.sources.base import EngineSnapshot
from collector.sources.generic import load_mapping
from collector.sources.poller import EngineSource
from collector.sources.served import models_url

__all__ = [
    "ENGINES",
    "EngineSnapshot",
    "EngineSource",
    "build_engine_source",
    "default_metrics_url",
    "models_url",
]

ENGINES = ("vllm", "sglang", "tgi", "llamacpp", "generic", "auto", "none")


def default_metrics_url(upstream: str) -> str:
    """The engine's /metrics beside its API: http://h:8000/v1 -> http://h:8000/metrics."""
    base = upstream.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return f"{base}/metrics"


def _split_engine(engine: str, mapping_path: str | Path | None) -> tuple[str, str | Path | None]:
    """`generic:path.yaml` is shorthand for engine generic with that mapping file."""
    name, sep, rest = (engine or "none").strip().partition(":")
    name = name.lower()
    if sep and name == "generic" and rest:
        return name, rest
    if sep:
        raise ValueError(f"--engine {engine!r}: only 'generic' takes a ':MAPPING.yaml' suffix")
    return name, mapping_path


def build_engine_source(
    engine: str,
    metrics_url: str | None,
    poll_interval_s: float = 1.0,
    *,
    timeout_s: float | None = None,
    mapping_path: str | Path | None = None,
    model: str | None = None,
    models_list_url: str | None = None,
    learn_adapters: bool = False,
) -> EngineSource | None:
    """An unstarted EngineSource for `engine` (None for 'none'); raises ValueError on bad input.

    `timeout_s` bounds each poll (default: the poll interval, at least 0.5 s and at most 2 s).
    `engine` may be `generic:MAPPING.yaml`, or `generic` with `mapping_path`. The engine series
    carry `model` when given, else the engine's own model label, else the one model
    `models_list_url` (the engine's `/v1/models`, see `models_url`) lists. With `learn_adapters`
    that list is also read for each LoRA adapter's base model (EngineSource.adapter_parents).
    """
    name, mapping_path = _split_engine(engine, mapping_path)
    if name == "none":
        return None
    if name not in ENGINES:
        raise ValueError(f"--engine {engine!r} is not one of {', '.join(ENGINES)}")
    if not metrics_url:
        raise ValueError("--engine-metrics-url is empty; give the engine's /metrics URL")
    if timeout_s is None:
        timeout_s = min(max(poll_interval_s, 0.5), 2.0)
    if name == "generic":
        if mapping_path is None:
            raise ValueError(
                "--engine generic needs a mapping: --engine generic:mapping.yaml (format in docs/engines.md)"
            )
        mapping = load_mapping(mapping_path)
        return EngineSource(
            mapping.engine,
            scrapers.generic_scraper(mapping, metrics_url),
            poll_interval_s=poll_interval_s,
            timeout_s=timeout_s,
            model=model,
            models_url=models_list_url,
            learn_adapters=learn_adapters,
        )
    scrape = {
        "auto": lambda: scrapers.auto_scraper(metrics_url),
        "llamacpp": lambda: scrapers.llamacpp_scraper(metrics_url),
    }.get(name, lambda: scrapers.text_scraper(scrapers.PARSERS[name], metrics_url))()
    return EngineSource(
        name,
        scrape,
        poll_interval_s=poll_interval_s,
        timeout_s=timeout_s,
        model=model,
        models_url=models_list_url,
        learn_adapters=learn_adapters,
    )
