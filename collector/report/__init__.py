"""The weekly capacity review: figures per model for a window against the previous window.

collect.py reads the rows and estimates from a RequestStore; build.py (pure) turns them into the
report dict; actions.py decides the recommended actions; render_md/render_html/render_json write
it out; review.py is the library the store's weekly job and GET /v1/report call; cli.py is
`headroom report`.
"""
