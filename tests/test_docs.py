"""The guides list what the code records: every hardware tag a run gets, and every column of
`rlhf runs`, in each place that lists them (no list that has fallen behind the code)."""

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
