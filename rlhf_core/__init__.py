"""Pure torch + transformers RLHF code (no Prefect, MLflow or data-gate imports).

OpenMP threads spin only briefly before they sleep. PyTorch's CPU ops run on libgomp threads
that spin while they wait for each other; on a machine whose cores other processes also use (a
loaded laptop, a shared CI box), a spinning thread waits for a descheduled one a whole time
slice at every parallel region. Fully passive waiting fixes that but is slower on an idle
machine. So, unless the environment sets ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``, this package
sets ``GOMP_SPINCOUNT=10000``: spin a little, then sleep (docs/benchmarks.md has the
measurements, idle and beside busy processes). The variable must be set before torch loads
libgomp, so it is set when this package is first imported (every stage imports it before torch).
"""

import os

if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")
