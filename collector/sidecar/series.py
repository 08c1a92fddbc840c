"""SeriesBudget: one bound on the series /metrics exports, shared out to models and tenants.

Per-label caps alone let the product explode: 50 tenants x 20 models is 1,000 label pairs, and
each pair and model fans out over outcomes and histogram buckets (9,425 series were reached with
the old caps). The budget counts what a label value would cost in the worst case before it
becomes a label value, so the exposition can never pass `max_series`:

    a model        its TTFT and TPOT histograms, one duration histogram per outcome, the engine's
                   queue, prefill and decode histograms and its two prompt-token counters
                   (series_per_model(): 263 with the catalog's buckets), plus its (model, other) pair
    a pair         (model, tenant): the two live gauges, the two token counters, one request
                   counter per outcome, one goodput counter per verdict and the good tokens
                   (series_per_pair(): 18)
    a task pair    (model, task class): the two live gauges, the oldest age per class and one
                   goodput counter per verdict (TASK_PAIR_SERIES: 9)
    age bounds     a model's in-flight requests past each age bound (AGE_SERIES_PER_MODEL: 5)
    an adapter     (model, LoRA adapter): its in-flight gauge (ADAPTER_PAIR_SERIES: 1); a model's
                   first adapter also its distinct-adapters and slots gauges (2), and (model,
                   other); at most `max_adapters` distinct adapters, then `other`
    probe load     `headroom probe`'s requests are labelled source="probe" (the SLO rules leave
                   them out): a model's first probe request costs its histograms again, and each
                   (model, tenant) pair's first one its request counter per outcome
    reserved       RESERVED_SERIES for everything that is not per request (engine, GPU, capacity,
                   request-log health, overhead histogram) and the (other, other) fold

A new model is admitted while fewer than `max_models` are and the budget has room, else it is
labelled `other`; a new (model, tenant) pair likewise with `max_tenants` distinct tenants, else its
tenant is `other`; a new (model, task class) pair while the budget has room, else its class is
`other`. A model's reservation includes its (model, other) tenant and task pairs. Probe load
past the budget is never relabelled as traffic: its latency and request counter are not exported
(its row still is). Folds are counted per request in headroom_label_values_folded_total{label}.
Admitted values stay admitted (counters cannot be taken back), so what is left only shrinks.

Example: SeriesBudget(3000) admits one model with 119 tenants, or 8 models with a tenant each;
the 9th model's requests are labelled ("other", tenant) while the budget has room for that pair.
"""

from __future__ import annotations

from collector.catalog import INFLIGHT_AGE_BOUNDS, spec
from collector.goodput import VERDICTS

__all__ = [
    "SeriesBudget",
    "OTHER",
    "PROBE",
    "TRAFFIC",
    "RESERVED_SERIES",
    "TASK_PAIR_SERIES",
    "ADAPTER_PAIR_SERIES",
    "AGE_SERIES_PER_MODEL",
    "series_per_model",
    "series_per_pair",
]

OTHER = "other"
TRAFFIC, PROBE = "traffic", "probe"  # values of the `source` label (the request row's source)
# headroom_task_inflight_requests, headroom_task_active_tokens, headroom_inflight_oldest_age_seconds
# and headroom_task_slo_requests_total per verdict
TASK_PAIR_SERIES = 3 + len(VERDICTS)
AGE_SERIES_PER_MODEL = len(INFLIGHT_AGE_BOUNDS)  # headroom_inflight_older_than_requests{older_than}
ADAPTER_PAIR_SERIES = 1  # headroom_adapter_inflight_requests
_ADAPTER_MODEL_SERIES = 2  # headroom_adapters_inflight and headroom_adapter_slots, per model
RESERVED_SERIES = 300  # measured: ~110 with an engine, one GPU and a published estimate; 8 GPUs ~150
_OUTCOMES = 7  # collector.sidecar.tracker.OUTCOMES
_PER_PAIR = (
    "headroom_inflight_requests",
    "headroom_active_tokens",
    "headroom_prompt_tokens_total",
    "headroom_generated_tokens_total",
    "headroom_slo_good_tokens_total",
)
_PER_MODEL = (
    "headroom_time_to_first_token_seconds",
    "headroom_time_per_output_token_seconds",
    "headroom_engine_queue_seconds",
    "headroom_engine_prefill_seconds",
    "headroom_engine_decode_seconds",
)
_ENGINE_TOKEN_SERIES = 2  # headroom_engine_prompt_tokens_total{cache}: computed, cached


def _histogram_series(name: str) -> int:
    return len(spec(name).buckets) + 3  # the buckets, +Inf, _sum and _count


def series_per_pair(outcomes: int = _OUTCOMES) -> int:
    """Worst-case series of one (model, tenant) pair: 5, one request counter per outcome and one
    goodput counter per verdict."""
    return len(_PER_PAIR) + outcomes + len(VERDICTS)


def series_per_model(outcomes: int = _OUTCOMES) -> int:
    """Worst-case series of one model: its latency and engine histograms, a duration one per
    outcome and its engine prompt-token counters."""
    return (
        sum(map(_histogram_series, _PER_MODEL))
        + outcomes * _histogram_series("headroom_request_duration_seconds")
        + _ENGINE_TOKEN_SERIES
    )


class SeriesBudget:
    """Label values for (model, tenant), keeping the whole exposition within `max_series`."""

    def __init__(
        self,
        max_series: int = 3000,
        *,
        max_models: int = 20,
        max_tenants: int = 50,
        reserved: int = RESERVED_SERIES,
        max_adapters: int = 32,
    ) -> None:
        self.max_series, self.max_models, self.max_tenants = max_series, max_models, max_tenants
        # its histograms, age bounds, and its `other` pair and task pair
        self._model_cost = series_per_model() + AGE_SERIES_PER_MODEL + series_per_pair() + TASK_PAIR_SERIES
        self._pair_cost = series_per_pair()
        self.left = max_series - reserved - self._model_cost  # (other, other) is always there
        if self.left < 0:
            raise ValueError(
                f"--max-series {max_series} is below the {max_series - self.left} series "
                "the sidecar needs with no model admitted; raise it"
            )
        self._models: set[str] = {OTHER}
        self._tenants: set[str] = set()
        self._pairs: set[tuple[str, str]] = set()
        self._task_pairs: set[tuple[str, str]] = set()
        self._probe_models: set[str] = set()
        self._probe_pairs: set[tuple[str, str]] = set()
        self.max_adapters = max_adapters
        self._adapters: set[str] = set()
        self.adapter_pairs: set[tuple[str, str]] = set()  # (model label, adapter label), admitted
        self.folded = {"model": 0, "tenant": 0, "task_class": 0, "source": 0, "adapter": 0}

    def labels(self, model: str, tenant: str) -> tuple[str, str]:
        """(model label, tenant label) for one request, e.g. ('m1', 'team-a') or ('m1', 'other')."""
        pair = (model, tenant)
        if pair in self._pairs:  # the common case: one set lookup
            return pair
        model_label = self._model_label(model)
        return model_label, self._tenant_label(model_label, tenant)

    def _model_label(self, model: str) -> str:
        if model in self._models:
            return model
        if len(self._models) - 1 < self.max_models and self.left >= self._model_cost:
            self._models.add(model)
            self.left -= self._model_cost
            return model
        self.folded["model"] += 1
        return OTHER

    def _tenant_label(self, model_label: str, tenant: str) -> str:
        pair = (model_label, tenant)
        if pair in self._pairs or tenant == OTHER:
            return tenant
        known = tenant in self._tenants
        if (known or len(self._tenants) < self.max_tenants) and self.left >= self._pair_cost:
            self._tenants.add(tenant)
            self._pairs.add(pair)
            self.left -= self._pair_cost
            return tenant
        self.folded["tenant"] += 1
        return OTHER

    def task_label(self, model_label: str, task_class: str) -> str:
        """The task-class label for a request of `model_label` (admitted already): itself or `other`."""
        pair = (model_label, task_class)
        if pair in self._task_pairs or task_class == OTHER:
            return task_class
        if self.left >= TASK_PAIR_SERIES:
            self._task_pairs.add(pair)
            self.left -= TASK_PAIR_SERIES
            return task_class
        self.folded["task_class"] += 1
        return OTHER

    def adapter_label(self, model_label: str, adapter: str) -> str | None:
        """The adapter label for a request of `model_label` (admitted already): itself, `other`, or
        None when the budget has no room even for the model's `other` (not exported)."""
        pair = (model_label, adapter)
        if pair in self.adapter_pairs:
            return adapter
        first = (model_label, OTHER) not in self.adapter_pairs  # the model's first adapter
        model_cost = ADAPTER_PAIR_SERIES + _ADAPTER_MODEL_SERIES if first else 0  # and its `other`
        known = adapter in self._adapters or len(self._adapters) < self.max_adapters
        if adapter != OTHER and known and self.left >= model_cost + ADAPTER_PAIR_SERIES:
            self._adapters.add(adapter)
            self.adapter_pairs.update({pair, (model_label, OTHER)})
            self.left -= model_cost + ADAPTER_PAIR_SERIES
            return adapter
        self.folded["adapter"] += 1
        if first:
            if self.left < model_cost:
                return None
            self.adapter_pairs.add((model_label, OTHER))
            self.left -= model_cost
        return OTHER

    def source_label(self, model_label: str, tenant_label: str, source: str) -> str | None:
        """The `source` label of a request of (model_label, tenant_label), admitted already: `source`
        itself, or None for probe load the budget has no room for (not exported, never `traffic`)."""
        if source == TRAFFIC or (model_label, tenant_label) in self._probe_pairs:
            return source
        cost = (0 if model_label in self._probe_models else series_per_model()) + _OUTCOMES
        if self.left >= cost:
            self._probe_models.add(model_label)
            self._probe_pairs.add((model_label, tenant_label))
            self.left -= cost
            return source
        self.folded["source"] += 1
        return None
