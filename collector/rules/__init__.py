"""Dashboards and alert rules as code, generated from the metric catalog.

    config.py        thresholds, SLOs, `for:` durations (one place, a sentence each)
    naming.py        `level:metric:operations` record names, catalog sample names
    recording.py     recording rules            alerting.py     alerting rules
    alertmanager.py  on-call routes/inhibition  dashboards.py   Grafana dashboards (panels.py builders)
    promtool_tests.py, recording_tests.py       promtool unit tests rendered beside the rules
    render.py        deterministic YAML/JSON    bundle.py       file name -> rendered text
    push.py          grafana-client upload      cli.py          `headroom dashboards|alerts ...`
"""
