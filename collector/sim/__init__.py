"""The built-in engine simulator: a continuous-batching model behind an OpenAI-compatible API.

  config        SimConfig, every knob, validated once
  cost          the documented roofline step-time model and the knee it predicts
  scheduler     the pure iteration-level scheduler (vLLM style): slots, token budget, KV blocks
  engine        the asyncio loop that runs the scheduler in time scaled by --speed
  output        prompt token counts and seeded, deterministic outputs
  openai        request parsing and the OpenAI wire format (chunks, usage)
  timings       the engine's own per-request timings: llama.cpp `timings`, vLLM `metrics`
  app           the FastAPI surface; metrics and slots: per-flavor /metrics and llama.cpp /slots
  cli           `headroom sim`
  load          a closed-loop load generator shared by the tests and `headroom demo`
  workload, demo_summary, demo_render   the demo's mixed workload, DuckDB summary and printout

docs/simulator.md explains the model with its public sources.
"""
