"""Every flow returns a typed record (tasks/pipeline/results.py, the stage and champion records):
its result reaches the CLI, the sweep, the events and the tests as fields, never a dict with
string keys or a bare value. Checked on the source, so a flow no test runs is held too."""

import ast
import re

from tests.shared import ROOT

UNTYPED = re.compile(r"(dict|list\[dict|Any$|None$|tuple)")


def flow_returns() -> list[tuple[str, str]]:
    """(module: flow name, its return annotation) of every ``@flow`` in flows/."""
    out = []
    for path in sorted((ROOT / "flows").rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and any(
                    "flow" == getattr(d.func if isinstance(d, ast.Call) else d, "id", "")
                    for d in node.decorator_list):
                returns = ast.unparse(node.returns) if node.returns else ""
                out.append((f"{path.relative_to(ROOT)}: {node.name}", returns))
    return out


def test_the_check_sees_every_flow():
    names = {name.split(": ")[1] for name, _ in flow_returns()}
    assert {"rlhf_pipeline", "rlhf_pipeline_served", "retrain", "compare", "rlhf_validate",
            "rlhf_sweep", "sweep_point", "collect_flow", "label_import", "label_pull",
            "rlhf_stage"} <= names


def test_every_flow_returns_a_typed_record():
    bad = [f"{name} -> {returns or 'no annotation'}" for name, returns in flow_returns()
           if not returns or UNTYPED.match(returns)]
    assert not bad, bad
