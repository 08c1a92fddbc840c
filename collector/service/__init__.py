"""The store service: the one process that owns the fleet's DuckDB file.

`app.create_store_app` serves ingest (from sidecars' `StoreShipper`), the token-protected query
API and the latest weekly report; `jobs.build_scheduler` runs rollups, retention, capacity refresh
and the weekly report on a schedule. `headroom store` (cli.py) runs it all.
"""
