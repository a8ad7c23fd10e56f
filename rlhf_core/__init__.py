"""Pure torch + transformers RLHF code (no Prefect, MLflow or data-gate imports).

OpenMP threads spin only briefly before they sleep. PyTorch's CPU ops run on libgomp threads
that spin while they wait for each other; on a machine whose cores other processes also use
(a loaded laptop, a shared CI box), a spinning thread waits for a descheduled one a whole
time slice at every parallel region (the first retrain on the demo took 1892 s at load ~5
against ~100 s idle). Fully passive waiting fixes that but costs 10-20% on an idle machine.
So, unless the environment sets ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``, this package sets
``GOMP_SPINCOUNT=10000``: spin a little, then sleep. Measured on the 2-core box, one
demo-sized PPO iteration with 2 threads (bench/ppo_bench.py --n-embd 128 --n-layer 2
--batch 64 --max-new-tokens 24, single runs): idle 0.87 s (always spinning: 0.97 s,
passive: 1.07 s); beside 6 busy processes 7.8 s (always spinning: 16.8 s, passive: 6.0 s).
The variable must be set before torch loads libgomp, so it is set when this package is
first imported (every stage imports it before torch).
"""

import os

if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")
