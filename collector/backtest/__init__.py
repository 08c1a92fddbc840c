"""`headroom alerts backtest`: the generated rules replayed over scenarios with known ground truth.

A scenario runs the simulator's pure scheduler in simulated time (no clock: a 2 h scenario takes
seconds), the series a sidecar and its engine would have exported are rebuilt at the scrape
interval, backfilled into a real Prometheus, and the generated rules are evaluated by it: recording
rules first, then every alert through Prometheus' own `for:`/`keep_firing_for` state machine. The
timeline says when each alert went pending, fired and resolved, the lead time before the SLO
breach the request rows show, and every alert outside a real problem.

    scenario      Scenario, Replica, Fault, Incident: what a scenario is (data only)
    scenarios     the built-in scenarios, by name
    simulate      the scheduler driven in simulated time: one RequestRecord per request
    exposition    records and engine samples -> the exported series at each scrape
    openmetrics   series -> OpenMetrics text for `promtool tsdb create-blocks-from openmetrics`
    truth         SLO truth from the rows: breaches and the windows where an alert is earned
    prometheus    a real Prometheus over backfilled blocks; range and instant queries
    alertstate    Prometheus' alert state machine (`for:`, `keep_firing_for`), pure
    alertsvector  ALERTS as literal vectors, for rules that read it
    evaluate      recording rules level by level, then alerts, on the real Prometheus
    timeline      episodes, lead times and false alerts, pure
    report        text and JSON of a backtest;  plot   the picture for people
    replay        a user's request log (DuckDB file or store service) as a scenario
    cli           `headroom alerts backtest`
"""
