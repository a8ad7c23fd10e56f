"""Prefect in the pipeline's words: its API (prefect_api.py: runs, names, reports, the one
retrain slot), the events the pipeline emits (events.py), a stage run on torchrun ranks
(launch.py) or another machine's worker (remote.py), logins, preflight, reconnecting, notices
and what a stage measures of itself (memory.py)."""
