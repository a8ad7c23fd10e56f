"""rlhf_core makes PyTorch's OpenMP threads spin only briefly before sleeping (set before
torch loads libgomp), unless the environment says otherwise."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items()
            if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    return subprocess.run([sys.executable, "-X", "importtime", "-c", code],
                          env={**base, "PYTHONPATH": str(ROOT), **env}, capture_output=True,
                          text=True, timeout=300, check=True)


def test_short_spin_before_torch_loads_in_a_flow_module():
    """flows.serve is what `rlhf serve` and a worker's flow run load first: rlhf_core (which
    sets the policy) must be imported before torch there, else the setting is too late."""
    out = _run("import os, flows.serve; print(os.environ['GOMP_SPINCOUNT'])")
    assert out.stdout.strip() == "10000"
    names = [line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines()]
    assert "torch" in names and names.index("rlhf_core") < names.index("torch")


def test_an_explicit_setting_wins():
    out = _run("import os, rlhf_core; print(os.environ['OMP_WAIT_POLICY'], "
               "os.environ.get('GOMP_SPINCOUNT'))", OMP_WAIT_POLICY="ACTIVE")
    assert out.stdout.split() == ["ACTIVE", "None"]
    out = _run("import os, rlhf_core; print(os.environ['GOMP_SPINCOUNT'])",
               GOMP_SPINCOUNT="300000")
    assert out.stdout.strip() == "300000"
