"""One run of the pipeline: its set-up (prepare.py), the stages (stages/), the champion rule
register applies (rule.py), and its result and close (finish.py); plus sweeps of runs."""
