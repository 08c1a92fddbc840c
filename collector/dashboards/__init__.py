"""Grafana dashboards as code, generated from the metric catalog: `headroom dashboards generate|push`.

boards.py    the three dashboards: capacity overview, tenants, weekly capacity review
panels.py    small builders for panels, targets, variables and the layout
files.py     file name -> rendered JSON             push.py   grafana-client upload
cli.py       `headroom dashboards generate|push`
"""
