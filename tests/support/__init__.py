"""Shared test plumbing, one of each: the fake OpenAI upstream (`support.upstream`), the process
helper for `headroom` subprocesses (`support.processes`), the poll helper (`support.waiting`), the
deterministic request-log rows (`support.synthetic`) and the simulator in simulated time
(`support.offline`), which the product never imports; promtool on bare PromQL (`support.promql`) and
a click command's passed defaults (`support.clickopts`)."""
