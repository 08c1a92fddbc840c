"""The request log and everything that owns or feeds its database.

schema.py      the `requests` table contract and its versioned migrations
arrow.py       records as Arrow (the columns' schema, rows_to_arrow): no DuckDB, the lake's spool uses it
db.py          RequestStore: the one read-write owner of a DuckDB file
writer.py      LogWriter: the RowSink that batches rows into a BatchSink off the event loop
spool.py       a bounded on-disk spool of Arrow batches: the lake writer's write-ahead buffer
owner.py       readers of a database another process (the sidecar) owns, through that process
rollup.py      the hourly `requests_hourly` rollup
retention.py   daily Parquet export of sealed days, then expiry of old raw rows
estimates.py   the `capacity_estimates` table: saved estimates, newest per model, publishing
capacity_gauges.py   the headroom_capacity_* gauges the newest estimates feed
jobs.py        the schedule: rollup, retention, capacity refresh, weekly review
"""
