"""The house has one direction: CLI -> flows -> tasks -> rlhf_core and data_checks. Checked on
the source (every import statement, including those inside functions), not on sys.modules,
so a lazy import that a test never triggers is caught too."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "rlhf_core": {"tasks", "flows", "data_checks", "prefect", "mlflow", "great_expectations"},
    "data_checks": {"tasks", "flows", "rlhf_core", "prefect", "mlflow"},
    "tasks": {"flows"},
}


def imported_packages(source: str) -> set[str]:
    """Top-level package of every absolute import in ``source``."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_the_checker_sees_imports_inside_functions():
    source = "import torch\n\ndef f():\n    from mlflow.tracking import MlflowClient\n"
    assert imported_packages(source) == {"torch", "mlflow"}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_import_points_up_the_layers(package):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files
    bad = {f"{path.relative_to(ROOT)}: {name}" for path in files
           for name in imported_packages(path.read_text()) & FORBIDDEN[package]}
    assert not bad, sorted(bad)


def test_no_test_module_imports_another():
    """Shared rows, files and look-ups live in tests/shared.py and conftest.py fixtures."""
    bad = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and \
                    node.module.split(".")[-1].startswith("test_"):
                bad.append(f"{path.relative_to(ROOT)}: {node.module}")
    assert not bad, bad


def imported_modules(source: str) -> set[str]:
    """Full dotted name of every absolute import in ``source``."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def test_rollouts_and_scoring_do_not_import_the_reward_model_trainer():
    """PPO reads reward scores through rlhf_core/scoring.py, not the RM trainer's module."""
    users = ["rollout.py", "ppo.py", "scoring.py", "global_stats.py", "evaluate.py"]
    bad = [name for name in users
           if "rlhf_core.reward" in imported_modules((ROOT / "rlhf_core" / name).read_text())]
    assert not bad, bad


# library functions written ahead of their production caller: global reward-normalisation
# statistics (for a data-parallel reward_norm stage); tested against the one-process function
AHEAD_OF_USE = {"global_reward_norm_stats"}


def test_no_production_function_exists_only_for_the_tests():
    """A top-level public function or class of the packages that only tests (or nothing) use
    belongs in tests/shared.py or its test module, not in production code."""
    packages = ("rlhf_core", "tasks", "flows", "data_checks")
    sources = {p: p.read_text() for pkg in packages for p in sorted((ROOT / pkg).rglob("*.py"))}
    names = [(p, node.name) for p, src in sources.items() for node in ast.parse(src).body
             if isinstance(node, ast.FunctionDef | ast.ClassDef)
             and not node.name.startswith("_")]
    words = re.compile(r"\w+")
    counts: dict[str, int] = {}
    for src in sources.values():
        for word in words.findall(src):
            counts[word] = counts.get(word, 0) + 1
    unused = [f"{p.relative_to(ROOT)}: {name}" for p, name in names
              if counts.get(name, 0) <= 1 and name not in AHEAD_OF_USE]
    assert not unused, unused
