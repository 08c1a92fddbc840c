"""The served model, for engines whose /metrics do not label it (llama.cpp, TGI, a generic mapping).

Request series carry the model clients name; the engine's series must carry the same name, or a
dashboard filtered to that model shows no KV cache, queue or ceiling. Where the engine's metrics
do not say it, the sidecar asks the engine's OpenAI-compatible `GET /v1/models` (the list clients
and `headroom probe` read the model name from) or takes `headroom run --model`:

    >>> served_model({"object": "list", "data": [{"id": "gemma-3-270m", "object": "model"}]})
    'gemma-3-270m'
    >>> served_model({"data": [{"id": "a"}, {"id": "b"}]})
    Traceback (most recent call last):
    ...
    ValueError: /v1/models lists 2 models (a, b); pass --model to say which one the engine series belong to

vLLM lists each LoRA adapter beside its base model with the base's id in `parent`; an adapter is
not another model, so it never makes the list ambiguous, and `adapter_parents` reads the pairs:

    >>> adapter_parents({"data": [{"id": "base", "parent": None}, {"id": "sql", "parent": "base"}]})
    {'sql': 'base'}
"""

from __future__ import annotations

__all__ = ["MAX_MODEL_CHARS", "models_url", "served_model", "adapter_parents"]

# The longest model label: a request's model is cut here too (collector.sidecar.requests), so the
# engine's series and the request series carry the same value for one long name.
MAX_MODEL_CHARS = 128


def models_url(upstream: str) -> str:
    """The engine's model list beside its API: http://h:8080 or http://h:8080/v1 -> http://h:8080/v1/models."""
    base = upstream.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return f"{base}/v1/models"


def served_model(listing: object) -> str:
    """The one model an OpenAI `GET /v1/models` answer lists; ValueError saying why there is none."""
    data = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(data, list):
        raise ValueError("/v1/models did not answer an OpenAI model list (no 'data' array)")
    ids = sorted(
        {
            entry["id"]
            for entry in data
            if isinstance(entry, dict) and _named(entry.get("id")) and not _named(entry.get("parent"))
        }
    )
    if not ids:
        raise ValueError("/v1/models lists no model")
    if len(ids) > 1:
        shown = ", ".join(ids[:5]) + (", ..." if len(ids) > 5 else "")
        raise ValueError(
            f"/v1/models lists {len(ids)} models ({shown}); "
            "pass --model to say which one the engine series belong to"
        )
    return str(ids[0])[:MAX_MODEL_CHARS]


def _named(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip())


def adapter_parents(listing: object) -> dict[str, str]:
    """{adapter: base model} of the entries of a `GET /v1/models` answer that name a `parent`
    other than themselves (vLLM's LoRA adapters); {} for anything else. Names are cut like models."""
    data = listing.get("data") if isinstance(listing, dict) else None
    found: dict[str, str] = {}
    for entry in data if isinstance(data, list) else ():
        if not isinstance(entry, dict):
            continue
        name, parent = entry.get("id"), entry.get("parent")
        if _named(name) and _named(parent) and name != parent:
            found[str(name)[:MAX_MODEL_CHARS]] = str(parent)[:MAX_MODEL_CHARS]
    return found
