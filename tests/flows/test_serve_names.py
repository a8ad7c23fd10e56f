"""Served pipeline runs are named as CLI runs are, plus what their form changed; a password
typed into the form shows as ``***`` in the name and in the overrides log line."""

import re

from prefect.runtime import flow_run

from flows.serve import (
    SERVED_FLOWS,
    _served_run_name,
    overrides_line,
    run_label,
    served_deployments,
)
from tasks.config.pipeline_config import PipelineConfig

STAMP = r"\d{8}-\d{6}-"  # the start time leads, as in MLflow's run name


def test_the_label_names_each_change_by_its_field(monkeypatch):
    assert run_label({"ppo.kl_coef": 0.07}) == "kl_coef=0.07"
    many = {f"ppo.f{i}": i for i in range(5)}
    assert run_label(many) == "f0=0 f1=1 f2=2 +2"
    assert run_label({}) == ""


def test_two_forms_give_two_names(monkeypatch):
    served = PipelineConfig().short_name()
    monkeypatch.setattr(flow_run, "parameters", {}, raising=False)
    assert re.fullmatch(STAMP + re.escape(served), _served_run_name())
    monkeypatch.setattr(flow_run, "parameters", {"ppo": {"kl_coef": 0.07}}, raising=False)
    changed = _served_run_name()
    assert re.fullmatch(STAMP + r"\S+ kl_coef=0\.07", changed), changed
    assert not changed.split(" ")[0].endswith(served)  # the config hash is the run's own
    monkeypatch.setattr(flow_run, "parameters", {"ppo": {"kl_coef": "x"}}, raising=False)
    assert _served_run_name() == "rlhf-pipeline"  # an invalid form: the flow reports it
    monkeypatch.setattr(flow_run, "parameters", {"tracking": {"run_name": "mine"}},
                        raising=False)
    assert _served_run_name() == "mine"  # tracking.run_name: the name in both UIs


def test_a_password_typed_into_the_form_shows_as_stars(monkeypatch):
    uri = "http://carol:s3cret-pw@127.0.0.1:5011"
    monkeypatch.setattr(flow_run, "parameters", {"tracking": {"tracking_uri": uri}},
                        raising=False)
    name = _served_run_name()
    assert name.endswith(" tracking_uri=http://carol:***@127.0.0.1:5011") and \
        "s3cret" not in name
    line = overrides_line({"tracking.tracking_uri": uri})
    assert "carol:***@127.0.0.1:5011" in line and "s3cret" not in line


def test_served_flows_lists_what_serve_registers_in_its_order():
    """Tests wait for each of SERVED_FLOWS before they read one (serve registers them one by
    one), so the list must be serve's own."""
    names = [(d.flow_name, d.name) for d in served_deployments(PipelineConfig(), "x")]
    assert names == [(flow, "x") for flow in SERVED_FLOWS]
