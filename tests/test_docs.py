"""The guides list what the code records: every hardware tag a run gets, every column of
`rlhf runs`, and each stage's metrics and artifacts as its table entry declares them, in each
place that lists them (no list that has fallen behind the code)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("doc", ["README.md", "docs/benchmarks.md", "docs/design.md"])
def test_each_list_of_hardware_tags_names_every_fact(doc):
    from rlhf_core.hardware import hardware_facts

    text = " ".join(ROOT.joinpath(doc).read_text().split())
    listed = set(re.findall(r"`rlhf\.hw\.(\w+)`", text))
    assert listed == set(hardware_facts()), (doc, listed ^ set(hardware_facts()))


def test_the_readme_names_every_column_of_rlhf_runs():
    from cli.runs import RUN_COLUMNS

    text = ROOT.joinpath("README.md").read_text()
    para = text[text.index("`rlhf runs` prints one line per parent run"):]
    para = " ".join(para[:para.index("\n\n")].split())
    for _, label in RUN_COLUMNS:
        assert f"`{label}`" in para, label


def stage_sections() -> dict[str, str]:
    """docs/design.md's ``## Stages``: each ``### <stage>`` heading -> its text."""
    text = ROOT.joinpath("docs/design.md").read_text()
    part = text[text.index("\n## Stages\n"):]
    part = part[:part.index("\n## ", 1)]
    return {head.strip(): body for head, body in
            (chunk.split("\n", 1) for chunk in part.split("\n### ")[1:])}


def documented_names(text: str) -> tuple[set[str], set[str]]:
    """(every backquoted name of a section, those that read as a metric or an artifact: a
    ``/`` in them or a file's suffix, not a path on disk), a trailing ``/`` dropped and
    ``<part>`` read as ``*``."""
    quoted = set(re.findall(r"`([^`\s]+)`", text))
    named = {n for n in quoted if not n.startswith(("~", "/", "$")) and (
        "/" in n or re.search(r"\.(json|jsonl|md|txt|html|png)$", n))}
    return tuple({re.sub(r"<[^>]+>", "*", n).rstrip("/") for n in names}
                 for names in (quoted, named))


def test_the_stage_contract_lists_what_each_table_entry_declares():
    """docs/design.md has a section per stage of the table, in its order (and ``finish``);
    each section names every metric and artifact its entry declares, and every such name it
    gives is declared (by its stage, or by the stage it quotes; a name inside a declared
    folder is fine): no stale or misspelt name."""
    from fnmatch import fnmatchcase

    from tests.shared import every_stage

    STAGES = every_stage()  # noqa: N806 - the table's name

    def covered(name: str, declared) -> bool:
        return any(fnmatchcase(name, d) or fnmatchcase(d, name) or name.startswith(f"{d}/")
                   for d in declared)

    sections = stage_sections()
    assert [name for name in sections if name != "finish"] == list(STAGES)
    every = [d for stage in STAGES.values() for d in (*stage.metrics, *stage.artifacts)]
    for name, stage in STAGES.items():
        quoted, named = documented_names(sections[name])
        missing = [d for d in (*stage.metrics, *stage.artifacts)
                   if not any(fnmatchcase(d, n) for n in quoted)]
        assert not missing, (name, missing)
        unknown = [n for n in named if not covered(n, every)]
        assert not unknown, (name, unknown)


def test_the_pipeline_is_written_out_in_the_tables_order():
    """docs/design.md's diagram and the README's task runs name the pipeline's stages."""
    from tests.shared import pipeline_stages

    order = ["prepare", *pipeline_stages(), "finish"]
    design = ROOT.joinpath("docs/design.md").read_text()
    assert re.findall(r"\w+", design.split("\n## The pipeline\n")[1].split("```")[1]) == order
    readme = " ".join(ROOT.joinpath("README.md").read_text().split())
    runs = readme.split("with its task runs: ", 1)[1].split(" (", 1)[0]
    assert runs.split(", ") == order


def test_the_detector_table_in_docs_is_the_code_s():
    """docs/health.md's table has a row per detector of rlhf_core/health/detectors.py, naming
    its failure, every signal, each setting with its default, its action and its advice."""
    from rlhf_core.health.detectors import DETECTORS

    doc = ROOT.joinpath("docs/health.md").read_text()
    rows = {line.split("|")[1].strip().strip("`"): line for line in doc.splitlines()
            if line.startswith("| `")}
    assert list(rows) == [d.name for d in DETECTORS]
    for d in DETECTORS:
        row, defaults = rows[d.name], d.settings()
        cells = [c.strip() for c in row.split("|")[1:-1]]
        assert cells[1] == d.failure and cells[-2] == defaults.action and cells[-1] == d.advice
        assert all(f"`{s}`" in cells[2] for s in d.signals), (d.name, d.signals)
        for name, value in defaults.model_dump(exclude={"action"}).items():
            shown = "auto" if value is None else format(value, "g")
            assert f"`{name}` ({shown})" in cells[3], (d.name, name, value)


# a path a docstring names: from a top folder of the tree, or a file by its suffix
TOP_FOLDERS = ("cli", "flows", "tasks", "rlhf_core", "data_checks", "tests", "docs", "bench",
               "configs")
SUFFIXES = (".py", ".md", ".yaml", ".yml", ".json", ".sh", ".toml")


def named_paths(doc: str) -> list[str]:
    """Paths (``tasks/gc/plan.py``, ``docs/design.md``) and bare file names (``rule.py``)
    that a docstring names; prose with a slash (``champion/challenger``) is no path."""
    found = []
    for match in re.finditer(r"(?<![\w/.`-])((?:[\w.-]+/)+[\w.-]*|[\w-]+\.py)(?![\w/])", doc):
        token = match.group(1).rstrip(".")
        if token.split("/")[0] in TOP_FOLDERS or token.endswith(SUFFIXES):
            found.append(token)
    return found


def named_settings(doc: str, sections: set[str]) -> list[list[str]]:
    """``ppo.kl_coef``-shaped names whose first part is a section of the pipeline config."""
    return [[section, *rest.split(".")]
            for section, rest in re.findall(r"(?<![\w./])([a-z_]+)\.([a-z_][\w.]*[a-z_0-9])", doc)
            if section in sections and rest.rsplit(".", 1)[-1] not in {"py", "md", "yaml", "json"}]


def setting_exists(model, parts: list[str]) -> bool:
    """Each part a field of the section before it (a field holding no section ends the walk:
    a dict's keys are free)."""
    import typing

    from pydantic import BaseModel

    for part in parts:
        fields = getattr(model, "model_fields", {})
        if part not in fields:
            return False
        annotation = fields[part].annotation
        inner = [a for a in (annotation, *typing.get_args(annotation))
                 if isinstance(a, type) and issubclass(a, BaseModel)]
        if not inner:
            return True
        model = inner[0]
    return True


def test_the_docstring_checker_tells_a_missing_path_and_setting():
    from tasks.config.pipeline_config import PipelineConfig

    doc = "See tasks/gone.py, rule.py and champion/challenger; ppo.kl_coef, ppo.nope, ppo.py."
    assert named_paths(doc) == ["tasks/gone.py", "rule.py", "ppo.py"]
    settings = named_settings(doc, set(PipelineConfig.model_fields))
    assert [setting_exists(PipelineConfig, s) for s in settings] == [True, False]


def test_module_docstrings_name_only_files_and_settings_that_exist():
    """A module's docstring names only files of the tree (a bare name: in its own folder or
    below), settings of the pipeline config, and stages by name, not by a number that the
    stage table's order would change."""
    import ast

    from tasks.config.pipeline_config import PipelineConfig

    sections = set(PipelineConfig.model_fields)
    bad, seen = [], 0
    for package in ("cli", "flows", "tasks", "rlhf_core", "data_checks"):
        for path in sorted((ROOT / package).rglob("*.py")):
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            where = path.relative_to(ROOT)
            for token in named_paths(doc):
                seen += 1
                near = [path.parent / token, *path.parent.rglob(token)] if "/" not in token \
                    else [ROOT / token, path.parent / token]
                if not any(p.exists() for p in near):
                    bad.append(f"{where}: {token}")
            for parts in named_settings(doc, sections):
                seen += 1
                if not setting_exists(PipelineConfig, parts):
                    bad.append(f"{where}: setting {'.'.join(parts)}")
            bad += [f"{where}: {m!r}" for m in re.findall(r"\bstages? \d", doc, re.IGNORECASE)]
    assert seen > 50  # the checker still finds names in the docstrings
    assert not bad, bad
