"""The fleet's request log on Apache Iceberg (docs/store.md, "The fleet's request log").

    layout    the lake: a pyarrow.fs location (a path, file://, s3://...) and the staged files'
              names, `staged/<writer>/<writer>-<seq>.parquet`
    stage     LakeWriter: the sidecar's BatchSink for `headroom run --lake`; the spool is its
              write-ahead buffer, each roll one immutable Parquet file per UTC day
    table     the Iceberg table (pyiceberg, the `[lake]` extra): catalog, commit, maintain, import
    read      a DuckDB RequestStore over the table, for the readers (`--catalog --lake`)
    cli       `headroom lake commit|maintain|import`

The sidecar imports only `layout` and `stage` (pyarrow, already in the slim install); pyiceberg
is imported by `table`, `read` and `cli` alone.
"""
