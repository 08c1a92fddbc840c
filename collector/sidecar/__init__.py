"""The sidecar: a streaming OpenAI-API proxy that tracks every request's lifecycle.

    config.py    SidecarConfig: everything `headroom run` can be told
    wiring.py    build_sidecar: the one place that decides the sources, sinks and jobs from a config
    app.py       create_app: the HTTP surface (proxy routes, /metrics, /healthz) and its lifespan
    proxy.py     the ASGI handlers: accounted completions and the untouched pass-through
    requests.py  reading a request body: model, stream flags, a prompt-token estimate
    tracker.py   live state, the dual-caliber gauges, counters, histograms, one row per request
    tenants.py   tenant resolution and label capping
    otel.py      OtelSink: one OpenTelemetry GenAI span per finished row
    cli.py       `headroom run`

Rows leave through RowSinks (collector.record); the request log's writer and shipper are in
collector.store, the engine and GPU sources in collector.sources.
"""
