"""One run of the pipeline: what it resolves before the first stage (prepare.py: the run,
its inputs' digests, identity.py; the gold judge, judge.py), the stages (stages/: the table,
the context a body is given, the bodies), the champion rule register applies (rule.py),
the reward's sources (rewards.py), the torch set-up (devices.py), the run folder's owners and
what a finished run keeps (owners.py, retention.py), its result and summary (results.py,
summary.py, finish.py) and a sweep of runs (sweep.py)."""
