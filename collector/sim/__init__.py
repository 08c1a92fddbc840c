"""The built-in engine simulator: a continuous-batching model behind an OpenAI-compatible API.

`config.SimConfig` holds the knobs, `cost` the documented step-time model, `scheduler` the pure
iteration-level scheduler (vLLM-style), `engine` the asyncio loop that runs it in scaled time,
`app` the FastAPI surface, `metrics` the per-flavor `/metrics` exposition and `load` a small
closed-loop load generator shared by the tests and `headroom demo`.
"""
