"""Pure torch + transformers RLHF code (no Prefect, MLflow or data-gate imports).

OpenMP threads wait passively by default here. PyTorch's CPU ops run on libgomp threads
that, by default, spin while they wait for each other; on a machine whose cores other
processes also use (a loaded laptop, a shared CI box), a spinning thread waits for a
descheduled one a whole time slice at every parallel region. Measured on this project's
2-core box at load ~8, a demo-sized training step with 2 threads: 1.7-4.9 s spinning vs
0.38-0.56 s passive (1 thread: 0.36-0.75 s); the first retrain on the demo took 1892 s at
load ~5 against ~100 s idle. The variable must be set before torch loads libgomp, so it is
set when this package is first imported (every stage imports it before torch); an explicit
``OMP_WAIT_POLICY`` in the environment wins.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
