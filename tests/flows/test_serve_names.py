"""Served pipeline runs are named as CLI runs are, plus what their form changed."""

from prefect.runtime import flow_run

from flows.serve import _served_run_name, run_label
from tasks.config import PipelineConfig


def test_the_label_names_each_change_by_its_field(monkeypatch):
    assert run_label({"ppo.kl_coef": 0.07}) == "kl_coef=0.07"
    many = {f"ppo.f{i}": i for i in range(5)}
    assert run_label(many) == "f0=0 f1=1 f2=2 +2"
    assert run_label({}) == ""


def test_two_forms_give_two_names(monkeypatch):
    served = f"rlhf-{PipelineConfig().short_name()}"
    monkeypatch.setattr(flow_run, "parameters", {}, raising=False)
    assert _served_run_name() == served
    monkeypatch.setattr(flow_run, "parameters", {"ppo": {"kl_coef": 0.07}}, raising=False)
    changed = _served_run_name()
    assert changed.startswith("rlhf-") and changed.endswith(" kl_coef=0.07")
    assert changed.split(" ")[0] != served  # the config hash is the run's own
    monkeypatch.setattr(flow_run, "parameters", {"ppo": {"kl_coef": "x"}}, raising=False)
    assert _served_run_name() == "rlhf-pipeline"  # an invalid form: the flow reports it
