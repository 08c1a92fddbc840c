"""The request log and everything that owns or feeds its database.

schema.py      the `requests` table contract and its versioned migrations
db.py          RequestStore: the one read-write owner of a DuckDB file
writer.py      LogWriter: the RowSink that batches rows into a BatchSink off the event loop
shipper.py     StoreShipper: the BatchSink that sends batches to `headroom store` instead
spool.py       the shipper's bounded on-disk spool for store outages
rollup.py      the hourly `requests_hourly` rollup
retention.py   daily Parquet export of sealed days, then expiry of old raw rows
estimates.py   the `capacity_estimates` table: saved estimates, newest per model, publishing
capacity_gauges.py   the headroom_capacity_* gauges the newest estimates feed
jobs.py        the schedule: rollup, retention, capacity refresh, weekly review
synthetic.py   deterministic synthetic rows for tests, docs and trials
"""
