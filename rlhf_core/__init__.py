"""Pure torch + transformers RLHF code (no Prefect, MLflow or data-gate imports). On first
import, unless the environment says otherwise, it sets ``GOMP_SPINCOUNT=10000``: on a busy
machine libgomp's spinning threads wait a whole time slice (docs/benchmarks.md).
"""

import os

if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")
