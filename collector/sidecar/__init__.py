"""The sidecar: a streaming OpenAI-API proxy that tracks every request's lifecycle.

    config.py        SidecarConfig: everything `headroom run` can be told
    options.py       `headroom run`'s options, each declared once with SidecarConfig's default
    wiring.py        build_sidecar: the one place that decides the sources, sinks and jobs from a config
    app.py           create_app: routing (proxy first, then FastAPI), the upstream pools, the lifespan
    admin.py         /metrics, /healthz, /readyz, /headroom: on the proxy's port or on --admin-listen
    memory.py        memory given back every minute: a full collection, then glibc's malloc_trim
    server.py        uvicorn with header and body deadlines, an idle timeout and a connection cap
    addresses.py     the per-client-address bounds: source_of, source_limits, SourceCounts
    descriptors.py   the connection cap fitted to the open-file limit (RLIMIT_NOFILE)
    paths.py         one spelling per path, before routing
    proxy.py         CompletionsProxy: the accounted routes, one function owning each request
    passthrough.py   PassThrough: every other /v1/* path, forwarded untouched, not accounted
    upstream.py      the one upstream client: HTTP/1.1 pools in protocol callbacks
    connection.py    PooledConnection: one upstream connection, parsing and relaying in its callbacks
    exchange.py      one request to the upstream: Exchange, its failures, BufferedBody
    headers.py       the request target and the headers each way between client and upstream
    client.py        the client's side: its body (bounded), its leaving (TaskWatch), its answer
    relay.py         relaying an answer to the client, one per-read step for callback and coroutine
    ending.py        how an exchange ended (Ending), and the Ending of each failure
    uvicorn_cycle.py the one module reading uvicorn's internals: CycleWatch, ChunkWriter
    requests.py      reading a request body: model, stream flags, a prompt-token estimate
    tracker.py       live state and its transitions, one row per request
    live.py          a live request's state (LiveRequest) and the one record it becomes
    exported.py      what the tracker exports: live gauges computed at scrape, counters, histograms
    exposition.py    the tracker's series kept as text, and the /metrics page
    series.py        SeriesBudget: one bound on the series /metrics exports
    tenants.py       tenant resolution and label capping
    adapters.py      LoRA adapters: a request's base model, and the adapters against the slots
    replica.py       the replica class, headroom_replica_info
    faults.py        one WARNING per failure class per interval
    tracecontext.py  W3C trace context and the response facts a span needs
    otel.py          OtelSink: one OpenTelemetry GenAI span per finished row
    otel_metrics.py  the OpenTelemetry GenAI server metrics
    cli.py           `headroom run`

Rows leave through RowSinks (collector.record); the request log's writer is in
collector.store (the lake's, for --lake, in collector.lake), the engine and GPU sources in collector.sources.
"""
