"""The store's HTTP routes, served under /headroom by the sidecar that owns the DuckDB file.

    routes.py      build_store_routes: the token-protected routes below as one router
    auth.py        the bearer token: where it comes from, where it is kept, how a request proves it
    ingest.py      POST /v1/ingest (rows from `headroom probe --db` through the owner, idempotent)
    queries.py     GET /v1/query/* (exact percentiles, curves, outcomes, probe runs, estimates)
    querysql.py    the whitelisted SQL builders behind the query routes
    validation.py  bad parameters answer 400 naming them, whichever app includes the routes

The database, its jobs and its estimates are collector.store; these routes only serve them.
A fleet's rows are the Iceberg table of collector.lake, which needs no server of ours.
"""
