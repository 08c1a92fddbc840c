"""The store service's HTTP API: the one process that owns the fleet's DuckDB file, over HTTP.

    app.py       create_store_app: /healthz, /metrics, and the token-protected routes below
    auth.py      the bearer token: where it comes from, where it is kept, how a request proves it
    ingest.py    POST /v1/ingest (rows from sidecars' StoreShipper, idempotent by request_id)
    queries.py   GET /v1/query/* (exact percentiles, curves, outcomes, probe runs, estimates)
    querysql.py  the whitelisted SQL builders behind the query routes
    cli.py       `headroom store`

The database, its jobs and its estimates are collector.store; the service only serves them.
"""
