"""Capacity analysis: per-level summaries, knee detection, SLO maximum, pool recommendation,
quota and KV-cache ceilings, passive curves from live traffic, estimates, and the probe.

The math lives in pure modules (stats, levels, knee, slo, recommend, quota, kv, littles_law,
passive); probe.py, estimate.py, refresh.py (the store's capacity job), plot.py and cli.py are the
thin shells around them. Estimates are kept by collector.store.estimates.
"""
