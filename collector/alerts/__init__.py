"""Prometheus rules as code, generated from the metric catalog: `headroom alerts generate`.

recording.py      recording rules (names in collector.rules.records)
alerting.py       alerting rules: scale-out signals, composite, KV cache, knee, 429s, SLO burn
alertmanager.py   on-call routes, grouping and inhibition
promtool_tests.py, recording_tests.py   promtool unit tests rendered beside the rules
templating.py     annotation text as Go templates and as the text a test expects
files.py          file name -> rendered text        cli.py   `headroom alerts generate`
"""
