"""The request log: schema, migrations, the DuckDB-backed store and the background writer."""
