"""llama.cpp's `/slots` view of the simulator: one slot per max_num_seqs, like `--parallel N`.

llama.cpp splits its context evenly across slots, so each slot's n_ctx is kv_cache_tokens / N.
Shape follows tests/fixtures/llamacpp/slots_busy.json (the fields engine sources read).
"""

from __future__ import annotations

from collector.sim.scheduler import Scheduler

__all__ = ["slots_view"]

Slot = dict[str, object]  # one slot as llama.cpp's /slots serialises it


def slots_view(scheduler: Scheduler) -> list[Slot]:
    """A list of slot dicts: busy slots carry their request's prompt and decode progress."""
    config = scheduler.config
    n_ctx = config.kv_cache_tokens // config.max_num_seqs
    slots = []
    for slot_id in range(config.max_num_seqs):
        request = scheduler.running[slot_id] if slot_id < len(scheduler.running) else None
        slot: Slot = {
            "id": slot_id,
            "n_ctx": n_ctx,
            "speculative": False,
            "is_processing": request is not None,
        }
        if request is not None:
            slot |= {
                "id_task": slot_id,
                "n_prompt_tokens": request.prompt_tokens,
                "n_prompt_tokens_processed": min(request.computed, request.prompt_tokens),
                "n_prompt_tokens_cache": 0,
                "params": {
                    "max_tokens": request.output_tokens,
                    "n_predict": request.output_tokens,
                    "stream": True,
                },
                "next_token": [
                    {
                        "has_next_token": not request.done,
                        "has_new_line": False,
                        "n_remain": request.output_tokens - request.generated,
                        "n_decoded": request.generated,
                    }
                ],
            }
        slots.append(slot)
    return slots
