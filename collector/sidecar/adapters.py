"""LoRA adapters: which base model a request's adapter belongs to, and the adapters against the slots.

Engines lump adapter traffic under the base model (vllm#11091), and clients name the adapter in
`model`. At admission the tracker asks `AdapterMap.resolve(model)`: a name that is an adapter
becomes (its base model, the adapter), so every request series, the engine series and the knee
stay the base model's, and the row and the adapter series say which adapter it was:

    AdapterMap({"sql-lora": "llama-3-8b"}).resolve("sql-lora")   -> ("llama-3-8b", "sql-lora")
    AdapterMap({"sql-lora": "llama-3-8b"}).resolve("llama-3-8b") -> ("llama-3-8b", None)

The pairs come from `headroom run --adapter NAME=BASE` (configured; they win), else from what the
engine's `/v1/models` lists with a `parent` (vLLM; the engine source asks once a minute).

`AdapterMetrics` exports, computed at scrape from the tracker's live set (nothing per chunk):

    headroom_adapter_inflight_requests{model, adapter}  requests in flight per adapter (capped
                                                        labels: SeriesBudget.adapter_label)
    headroom_adapters_inflight{model}                   distinct adapters in flight: real names,
                                                        so a fold into `other` never hides one
    headroom_adapter_slots{model}                       the engine's adapter slots: --adapter-slots,
                                                        else vLLM's max_lora / SGLang's
                                                        lora_pool_slots_total

Why the live set and not the engine's series: the sidecar sees every in-flight request, queued or
running, of every engine, at the moment of the scrape. vLLM lists adapters only in an info
series whose running and waiting lists overlap (summing them saw saturation at half the real
limit, llm-d-router PR #2625) and whose idle adapters vanish; SGLang counts only the running
batch's, which can never exceed the slots: demand past the slots, the thrash, is invisible there.
The series exist only for base models that have had adapter traffic, and cost the series budget.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily, Metric

from collector.catalog import spec
from collector.sources.served import MAX_MODEL_CHARS

if TYPE_CHECKING:
    from collector.sidecar.tracker import Tracker

__all__ = ["AdapterMap", "AdapterMetrics", "parse_adapter_pairs"]


def parse_adapter_pairs(pairs: Mapping[str, str] | list[str] | tuple[str, ...]) -> dict[str, str]:
    """{adapter: base} from `NAME=BASE` strings (or a mapping); ValueError naming a bad one.

    ["sql-lora=llama-3-8b"] -> {"sql-lora": "llama-3-8b"}
    """
    items = pairs.items() if isinstance(pairs, Mapping) else [_split(text) for text in pairs]
    found: dict[str, str] = {}
    for name, base in items:
        name, base = name.strip()[:MAX_MODEL_CHARS], base.strip()[:MAX_MODEL_CHARS]
        if not name or not base or name == base:
            raise ValueError(f"--adapter {name}={base}: give ADAPTER=BASE_MODEL, two different names")
        found[name] = base
    return found


def _split(text: str) -> tuple[str, str]:
    name, sep, base = text.partition("=")
    if not sep:
        raise ValueError(f"--adapter {text!r}: give ADAPTER=BASE_MODEL")
    return name, base


class AdapterMap:
    """Adapter -> base model, from configuration first, then from the engine's `/v1/models`."""

    def __init__(
        self,
        configured: Mapping[str, str] | None = None,
        learned: Callable[[], Mapping[str, str]] | None = None,
    ) -> None:
        self.configured = dict(configured or {})
        self._learned = learned

    def resolve(self, model: str) -> tuple[str, str | None]:
        """(base model, adapter) for a request's `model`; (model, None) when it names no adapter."""
        base = self.configured.get(model)
        if base is None and self._learned is not None:
            base = self._learned().get(model)
        return (model, None) if base is None else (base, model)


class AdapterMetrics:
    """prometheus_client collector of the adapter series, summed from the live set at scrape."""

    def __init__(self, tracker: Tracker, slots: Callable[[], int | None]) -> None:
        self._tracker = tracker
        self._slots = slots
        self._specs = tuple(
            spec(name)
            for name in (
                "headroom_adapter_inflight_requests",
                "headroom_adapters_inflight",
                "headroom_adapter_slots",
            )
        )

    def values(self) -> tuple[dict[tuple[str, str], int], dict[str, int], int | None]:
        """(in flight per (model, adapter) label pair, distinct adapters in flight per model, slots)."""
        pairs = self._tracker.budget.adapter_pairs
        inflight = dict.fromkeys(pairs, 0)
        distinct: dict[str, set[str]] = {model: set() for model, _ in pairs}
        for request in list(self._tracker.live.values()):
            if request.adapter is None or request.adapter_label is None:
                continue
            key = (request.model_label, request.adapter_label)
            inflight[key] = inflight.get(key, 0) + 1
            distinct.setdefault(request.model_label, set()).add(request.adapter)
        return inflight, {model: len(names) for model, names in distinct.items()}, self._slots()

    def collect(self) -> Iterator[Metric]:
        """The three families; nothing at all before the first adapter request."""
        inflight, distinct, slots = self.values()
        if not inflight:
            return
        per_adapter, count, slot = (
            GaugeMetricFamily(entry.name, entry.help, labels=entry.labels) for entry in self._specs
        )
        for key in sorted(inflight):
            per_adapter.add_metric(key, inflight[key])
        for model in sorted(distinct):
            count.add_metric([model], distinct[model])
            if slots is not None:
                slot.add_metric([model], slots)
        yield per_adapter
        yield count
        if slots is not None:
            yield slot
