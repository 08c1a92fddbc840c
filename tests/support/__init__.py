"""Shared test plumbing, one of each: the fake OpenAI upstream (`support.upstream`), the process
helper for `headroom` subprocesses (`support.processes`) and the poll helper (`support.waiting`)."""
