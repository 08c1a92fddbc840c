"""What the generated dashboards and alerts share, so the two never disagree.

    config.py    thresholds, SLOs, `for:` durations (one place, a sentence each)
    naming.py    `level:metric:operations` conventions, catalog sample names
    records.py   the recording-rule names (`R`), read by panels and alerts alike
    render.py    deterministic YAML/JSON and the do-not-edit notice
    files.py     writing generated files, or checking the committed copies

The generators themselves are the sibling packages collector.dashboards and collector.alerts.
"""
