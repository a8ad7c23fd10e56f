"""Pure torch + transformers RLHF code (no Prefect, MLflow or data-gate imports).

On a busy machine libgomp's spinning threads wait a whole time slice for descheduled ones, so
unless the environment says otherwise this sets ``GOMP_SPINCOUNT=10000`` (spin a little, then
sleep; docs/benchmarks.md), on first import, before torch loads libgomp.
"""

import os

if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")
