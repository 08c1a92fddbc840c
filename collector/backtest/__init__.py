"""`headroom alerts backtest`: the generated rules replayed over scenarios with known ground truth.

A scenario runs the simulator's pure scheduler in simulated time (no clock: a 2 h scenario takes
seconds), the series a sidecar and its engine would have exported are rebuilt at the scrape
interval, backfilled into a real Prometheus, and the generated rules are evaluated by it: recording
rules first, then every alert through Prometheus' own `for:`/`keep_firing_for` state machine. The
timeline says when each alert went pending, fired and resolved, the lead time before the SLO
breach the request rows show, and every alert outside a real problem.

    scenario         Scenario, Replica, Fault, Incident, Expect: what a scenario is (data only)
    scenarios        the built-in scenarios, by name
    lifecycle        Lifecycle: one request, from the simulator or a request-log row
    simulate         the scheduler driven in simulated time: records and engine samples
    exposition       records -> the sidecar's series at each scrape (scenarios and replays alike)
    scenario_series  + the engine, GPU, capacity and log series, and the scrape faults
    openmetrics      SeriesSet and its OpenMetrics text for `promtool tsdb create-blocks-from openmetrics`
    truth            SLO truth from the rows: when users were hurt
    prometheus       a real Prometheus over backfilled blocks; range and instant queries
    alertstate       Prometheus' alert state machine (`for:`, `keep_firing_for`), pure
    alertsvector     ALERTS as literal vectors, for rules that read it
    evaluate         recording rules level by level, then alerts, on the real Prometheus
    timeline         episodes, lead times and false alerts, pure
    notifications    what the generated Alertmanager config sends of them: grouping, inhibition, pure
    verdict          a scenario's expectations checked against its timeline
    run              one backtest end to end
    report, plot     text, JSON and the markdown table; the picture
    replay           a user's request log (DuckDB file or the fleet's table) as a backtest
    cli              the `headroom alerts` group and `backtest`
"""
