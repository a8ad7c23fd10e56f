"""The house has one direction: cli -> flows -> tasks -> rlhf_core and data_checks, flows only
wire (no MLflow: its look-ups are tasks'; every function in flows/ is a flow or is called by
one), tasks/ is cut by feature (platform -> pipeline -> retrain -> gc, each importing only those
before it), only tasks/platform/mlflow/ and a feature's own store (e.g. tasks/gc/store.py)
import mlflow, MLflow tags are named in tasks/platform/mlflow/tags.py, and no module imports
itself back through others.
Checked on the source (every import statement, including those inside functions), not on
sys.modules, so a lazy import that a test never triggers is caught too."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "rlhf_core": {"cli", "tasks", "flows", "data_checks", "prefect", "mlflow",
                  "great_expectations"},
    "data_checks": {"cli", "tasks", "flows", "rlhf_core", "prefect", "mlflow"},
    "tasks": {"cli", "flows"},
    "flows": {"cli", "mlflow"},
    "cli": {"mlflow"},
}
PACKAGES = ("cli", "flows", "tasks", "rlhf_core", "data_checks")


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


def speaks_mlflow(path: Path) -> bool:
    """tasks/platform/mlflow/ (runs, models, registry, artifacts...) and a feature's own store
    (``store.py`` in its folder: what that feature alone keeps in MLflow)."""
    return (ROOT / "tasks" / "platform" / "mlflow") in path.parents or (
        path.name == "store.py" and path.parent != ROOT / "tasks")


def test_only_the_mlflow_platform_and_a_features_store_import_mlflow():
    """MLflow is tasks/platform/mlflow/'s business and, for what one feature alone keeps there,
    that feature's store: the rest of tasks/ calls them, never mlflow itself (flows/ neither:
    FORBIDDEN)."""
    files = [p for p in sorted((ROOT / "tasks").rglob("*.py")) if not speaks_mlflow(p)]
    assert files and any(speaks_mlflow(p) for p in (ROOT / "tasks").rglob("store.py"))
    bad = [str(p.relative_to(ROOT)) for p in files if "mlflow" in imported_packages(p.read_text())]
    assert not bad, bad


TAGS_MODULE = "tasks/platform/mlflow/tags.py"
# strings shaped like a tag name that are not MLflow tags: (file, string) -> why
NOT_TAGS = {
    ("tasks/pipeline/stages/progress.py", "rlhf.progress"): "a logger's name",
    ("tasks/platform/mlflow/spool.py", "rlhf.spool"): "a logger's name",
    ("tasks/platform/mlflow/runs.py", "rlhf.tracking"): "a logger's name",
    ("tasks/platform/prefect/remote.py", "rlhf.remote"): "a logger's name",
    ("flows/serve.py", "rlhf.preferences.*"): "the retrain trigger's Prefect event resources",
    ("flows/serve.py", "rlhf.imported_by"): "the retrain trigger's Prefect event label",
    ("tasks/platform/prefect/prefect_api.py", "rlhf.slot:"):
        "the Prefect flow-run tag of a slot's holder",
}
NOT_TAG_FILES = {  # file -> why its strings shaped like tag names are not MLflow tags
    "tasks/platform/prefect/events.py": "the Prefect events' names, resources and labels",
}


def tag_literals(source: str) -> list[str]:
    """String constants of ``source`` (f-strings' constant parts too; not docstrings) that
    start like a tag name (``rlhf.``, ``mlflow.``) or quote one in a search filter
    (``tags.`rlhf.x` = ...``)."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef
                                | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings
            and re.search(r"^(rlhf|mlflow)\.|`(rlhf|mlflow)\.", node.value)]


def test_the_tag_finder_sees_f_strings_and_filters_not_docstrings():
    source = ('"""Sets ``rlhf.a``."""\n\ndef f(x):\n    """Reads rlhf.b."""\n'
              '    g({"rlhf.c": 1, f"rlhf.d.{x}": 2, "mlflow.parentRunId": 3, "rlhf": 4})\n'
              '    return f"tags.`rlhf.e` = \'{x}\'"\n')
    assert sorted(tag_literals(source)) == ["mlflow.parentRunId", "rlhf.c", "rlhf.d.",
                                            "tags.`rlhf.e` = '"]


def test_every_tag_name_is_written_in_the_tags_module():
    """An MLflow tag name is written once, in tasks/platform/mlflow/tags.py; tasks/ and flows/ use
    its constants, so a tag's readers and writers cannot drift apart."""
    found = {(str(path.relative_to(ROOT)), text) for package in ("tasks", "flows")
             for path in sorted((ROOT / package).rglob("*.py"))
             for text in tag_literals(path.read_text())}
    bad = sorted(f"{name}: {text!r}" for name, text in found - set(NOT_TAGS)
                 if name != TAGS_MODULE and name not in NOT_TAG_FILES)
    assert not bad, bad
    assert set(NOT_TAGS) <= found, f"stale NOT_TAGS entries: {set(NOT_TAGS) - found}"


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
    """PPO reads reward scores through rlhf_core/models/scoring.py, not the RM trainer's module."""
    users = ["ppo/rollout.py", "ppo/trainer.py", "models/scoring.py",
             "parallel/global_stats.py", "eval/evaluate.py"]
    bad = [name for name in users
           if "rlhf_core.train.reward" in imported_modules((ROOT / "rlhf_core" / name).read_text())]
    assert not bad, bad


# library functions written ahead of their production caller: global reward-normalisation
# statistics (for a data-parallel reward_norm stage); tested against the one-process function
AHEAD_OF_USE = {"global_reward_norm_stats"}


def code_words(source: str) -> list[str]:
    """The names and attributes ``source``'s code uses (docstrings and comments left out)."""
    words = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            words.append(node.id)
        elif isinstance(node, ast.Attribute):
            words.append(node.attr)
        elif isinstance(node, ast.alias):
            words.append(node.name.split(".")[-1])
    return words


# a ``module:function`` target a user writes in a config (a reward source), as the docs,
# configs and benchmarks name it
TARGET = re.compile(r"\b(?:cli|flows|tasks|rlhf_core|data_checks)(?:\.\w+)+:(\w+)")


def test_no_production_function_exists_only_for_the_tests():
    """A top-level public function or class of the packages that only tests (or nothing) use
    belongs in tests/shared.py or its test module, not in production code; a mention in a
    docstring is no use, a config target that the docs or a benchmark name is."""
    sources = {p: p.read_text() for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}
    names = [(p, node.name) for p, src in sources.items() for node in ast.parse(src).body
             if isinstance(node, ast.FunctionDef | ast.ClassDef)
             and not node.name.startswith("_")]
    counts: dict[str, int] = {}
    for src in sources.values():
        for word in code_words(src):
            counts[word] = counts.get(word, 0) + 1
    documents = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"),
                 *(ROOT / "configs").rglob("*.yaml"), *(ROOT / "bench").glob("*.py")]
    targets = {m for d in documents for m in TARGET.findall(d.read_text())}
    unused = [f"{p.relative_to(ROOT)}: {name}" for p, name in names
              if counts.get(name, 0) < 1 and name not in AHEAD_OF_USE | targets]
    assert not unused, unused


def module_name(path: Path) -> str:
    """tasks/x.py -> tasks.x; a package's __init__.py -> the package."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_imports(source: str, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``source`` imports, inside functions too: ``import
    tasks.x`` and ``from tasks.x import y`` -> tasks.x, ``from tasks import x`` -> tasks.x
    where x is a module (else the package); a name that is not a module -> its nearest
    enclosing one."""

    def nearest(name: str) -> str | None:
        parts = name.split(".")
        return next((".".join(parts[:n]) for n in range(len(parts), 0, -1)
                     if ".".join(parts[:n]) in modules), None)

    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {nearest(alias.name) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found |= {nearest(f"{node.module}.{alias.name}") for alias in node.names}
    return found - {None}


def import_graph() -> dict[str, set[str]]:
    """Each module of the project's packages -> the project modules it imports."""
    paths = {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}
    return {name: module_imports(path.read_text(), set(paths)) - {name}
            for name, path in paths.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The modules of each import circle (Tarjan's strongly connected components of more
    than one module), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = stack[stack.index(node):]
            del stack[stack.index(node):]
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)


def test_the_cycle_finder_sees_lazy_and_package_imports():
    modules = {"tasks", "tasks.a", "tasks.b", "tasks.c", "flows.x"}
    lazy = "import os\n\ndef f():\n    from tasks import a, missing\n    import tasks.c.part\n"
    assert module_imports(lazy, modules) == {"tasks.a", "tasks", "tasks.c"}
    graph = {"tasks.a": {"tasks.b"}, "tasks.b": {"tasks.c"}, "tasks.c": {"tasks.a"},
             "flows.x": {"tasks.a"}, "tasks": set()}
    assert import_cycles(graph) == [["tasks.a", "tasks.b", "tasks.c"]]
    assert import_cycles({**graph, "tasks.c": set()}) == []


def test_no_import_circle_between_modules():
    """A module that imports another which (through any others) imports it back is one
    module cut in two: what both need belongs below both."""
    cycles = import_cycles(import_graph())
    assert not cycles, "import circles among: " + "; ".join(", ".join(c) for c in cycles)


def test_no_import_circle_between_packages():
    graph: dict[str, set[str]] = {}
    for module, imported in import_graph().items():
        graph.setdefault(module.split(".")[0], set()).update(
            name.split(".")[0] for name in imported)
    graph = {pkg: targets - {pkg} for pkg, targets in graph.items()}
    cycles = import_cycles(graph)
    assert not cycles, "package circles among: " + "; ".join(", ".join(c) for c in cycles)


def sub_package(module: str, package: str) -> str | None:
    """tasks.pipeline.stages.sft -> pipeline (for package tasks; stages for
    tasks.pipeline); a top-level module of the package -> None."""
    parts, depth = module.split("."), package.count(".") + 1
    inside = parts[:depth] == package.split(".") and len(parts) > depth + 1
    return parts[depth] if inside else None


def wing_graph(package: str) -> dict[str, set[str]]:
    """The sub-packages of ``package`` -> those they import."""
    graph: dict[str, set[str]] = {}
    for module, imported in import_graph().items():
        wing = sub_package(module, package)
        if wing is not None:
            graph.setdefault(wing, set()).update(
                w for w in (sub_package(m, package) for m in imported) if w not in (None, wing))
    return graph


# tasks/ by feature, bottom up: a folder imports only those before it. config is the
# pipeline config, below them all; platform speaks for MLflow and Prefect in the pipeline's
# words; pipeline is the stages and a run of them; retrain (the gate, sign-off, labels) runs
# the pipeline round after round; gc clears what both leave.
TASKS_FEATURES = ["config", "platform", "pipeline", "retrain", "gc"]


def test_tasks_is_cut_by_feature_and_imports_downwards_only():
    top = sorted(p.name for p in (ROOT / "tasks").glob("*.py"))
    assert top == ["__init__.py"], top
    graph = wing_graph("tasks")
    assert set(graph) == set(TASKS_FEATURES), graph
    upward = {f"{wing} -> {other}" for wing, targets in graph.items() for other in targets
              if TASKS_FEATURES.index(other) > TASKS_FEATURES.index(wing)}
    assert not upward, sorted(upward)
    assert not graph["config"], graph["config"]


def test_the_parts_of_a_feature_import_each_other_in_one_direction():
    """MLflow's client knows nothing of Prefect; retrain's gate, sign-off and labels and its
    loose modules form no circle."""
    platform = wing_graph("tasks.platform")
    assert {"mlflow", "prefect"} <= set(platform) and "prefect" not in platform["mlflow"]
    retrain = wing_graph("tasks.retrain")
    assert {"gate", "approval", "labels"} <= set(retrain)
    assert not import_cycles(retrain), retrain


# rlhf_core's layers, bottom up: a sub-package imports only those before it
CORE_LAYERS = ["models", "parallel", "train", "ppo", "eval", "health"]


def test_rlhf_core_layers_import_downwards_only():
    graph = wing_graph("rlhf_core")
    assert set(graph) == set(CORE_LAYERS)
    upward = {f"{layer} -> {other}" for layer, targets in graph.items() for other in targets
              if CORE_LAYERS.index(other) > CORE_LAYERS.index(layer)}
    assert not upward, sorted(upward)


def test_flows_hold_flows_and_their_wiring_only():
    """Every top-level function of flows/ is a Prefect flow, is called within flows/ (the
    wiring the flows share), or serves them (``serve*``: what `rlhf serve` and `rlhf
    stage-worker` run); a function only the command line or tests call belongs in cli/ or
    below, as do config loading, preflight and the other runtime code."""
    modules = {p: ast.parse(p.read_text()) for p in sorted((ROOT / "flows").rglob("*.py"))}
    called: dict[str, set[str]] = {}
    for path, tree in modules.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                called.setdefault(node.id, set()).add(path.name)
            elif isinstance(node, ast.Attribute):
                called.setdefault(node.attr, set()).add(path.name)
    bad = []
    for path, tree in modules.items():
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            is_flow = any("flow" == (d.func if isinstance(d, ast.Call) else d).id
                          for d in node.decorator_list
                          if isinstance(d.func if isinstance(d, ast.Call) else d, ast.Name))
            # serve / serve_stage: how `rlhf serve` and `rlhf stage-worker` serve the flows
            if not is_flow and node.name not in called and not node.name.startswith("serve"):
                bad.append(f"{path.relative_to(ROOT)}: {node.name}")
    assert not bad, bad


# what hands out an MLflow client: RunContext.client(), tasks/platform/mlflow/runs.py's makers
CLIENT_MAKERS = {"client", "tracking_client", "experiment_client", "MlflowClient"}


def client_method_calls(source: str, methods: set[str] | None) -> list[str]:
    """``line: receiver.method`` of each call in ``source`` of a method in ``methods`` (None:
    any) on a client: what a client maker returns (``ctx.client()``, ``tracking_client(u)``,
    ``experiment_client(u, e)[0]``), a name or attribute ending in ``client`` (``client``,
    ``sc.client``, ``self._client``), or a name assigned from one of those in the module
    (``c = ctx.client()``, ``c, exp = experiment_client(...)``)."""
    tree = ast.parse(source)
    aliases: set[str] = set()

    def is_client(node: ast.AST) -> bool:
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else \
                func.attr if isinstance(func, ast.Attribute) else None
            return name in CLIENT_MAKERS
        if isinstance(node, ast.Subscript):
            return is_client(node.value)
        name = node.id if isinstance(node, ast.Name) else \
            node.attr if isinstance(node, ast.Attribute) else ""
        return name.lower().endswith("client") or name in aliases

    for _ in range(2):  # an alias of an alias
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and is_client(node.value):
                for target in node.targets:
                    first = target.elts[0] if isinstance(target, ast.Tuple) else target
                    if isinstance(first, ast.Name):
                        aliases.add(first.id)
    return [f"{node.lineno}: {ast.unparse(node.func)}" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and (methods is None or node.func.attr in methods) and is_client(node.func.value)]


def test_the_client_call_finder_sees_aliases_and_tells_prefect_apart():
    source = ("def f(ctx, uri, client):\n    ctx.client().set_terminated('r')\n"
              "    c = tracking_client(uri)\n    c.search_runs(['0'])\n"
              "    d, exp = experiment_client(uri, 'e')\n    d.get_run('r')\n"
              "    sc.client.log_text('r', 't', 'a')\n    sc.log_text('t', 'a')\n"
              "    set_tags(ctx.client(), 'r', {})\n"
              "    with get_client(sync_client=True) as client:\n"
              "        client.update_flow_run('id', name='n')\n")
    mlflow_methods = {"set_terminated", "search_runs", "get_run", "log_text"}
    assert client_method_calls(source, mlflow_methods) == [
        "2: ctx.client().set_terminated", "4: c.search_runs", "6: d.get_run",
        "7: sc.client.log_text"]
    assert "11: client.update_flow_run" in client_method_calls(source, None)


def test_only_the_mlflow_platform_and_a_features_store_call_the_mlflow_client():
    """Outside tasks/platform/mlflow/ and a feature's store no code calls a method of
    MlflowClient (its public names, read from mlflow at test time) on a client that the
    platform hands out: each MLflow call goes through a platform function named for what it
    does for the pipeline. The receiver is
    what matters, not the method's name alone: StageContext's own ``log_text``... are
    pipeline helpers, and Prefect's clients (tasks/platform/prefect/, also named
    ``client``) call none of MlflowClient's methods (``read_flow_run``, ``update_flow_run``...), so
    they are never flagged."""
    from mlflow.tracking import MlflowClient

    methods = {name for name in dir(MlflowClient) if not name.startswith("_")}
    files = [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))
             if not (pkg == "tasks" and speaks_mlflow(p))]
    assert {"cli", "flows", "tasks"} <= {p.relative_to(ROOT).parts[0] for p in files}
    bad = [f"{p.relative_to(ROOT)}:{call}" for p in files
           for call in client_method_calls(p.read_text(), methods)]
    assert not bad, bad
    api = "tasks/platform/prefect/prefect_api.py"
    prefect = client_method_calls((ROOT / api).read_text(), None)
    assert prefect, f"the finder no longer sees the Prefect client of {api}"


def test_the_form_rules_live_in_the_pipeline_config_alone():
    """How Prefect's form draws a section and reads it back is tasks/config/form.py's: no section
    of rlhf_core or data_checks carries a schema hook or a form's reading of blanks."""
    bad = [f"{p.relative_to(ROOT)}: {word}" for pkg in ("rlhf_core", "data_checks")
           for p in sorted((ROOT / pkg).rglob("*.py"))
           for word in ("json_schema_extra", "__get_pydantic_json_schema__", "_form_blanks")
           if word in p.read_text()]
    assert not bad, bad
    assert "def draw_form" in (ROOT / "tasks" / "config" / "form.py").read_text()
