"""The sidecar: a streaming OpenAI-API proxy that tracks every request's lifecycle.

Modules: `config` (settings), `requests` (parsing a request body), `sse` (splitting and reading an
event stream), `tracker` (live state, dual-caliber gauges, counters, histograms, rows),
`tenants` (label capping), `proxy` (the ASGI handlers), `app` (wiring), `cli` (`headroom run`).
"""
