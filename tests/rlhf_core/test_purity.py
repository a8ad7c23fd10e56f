"""rlhf_core stays pure torch + transformers: importing every module pulls in no
orchestration, tracking or data-validation framework."""

import pkgutil
import subprocess
import sys

import rlhf_core


def test_rlhf_core_imports_no_prefect_mlflow_or_great_expectations():
    modules = [f"rlhf_core.{m.name}" for m in pkgutil.iter_modules(rlhf_core.__path__)]
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "bad = [m for m in ('prefect', 'mlflow', 'great_expectations') if m in sys.modules]\n"
            "print(','.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert len(modules) >= 10
    assert out.stdout.strip() == ""
