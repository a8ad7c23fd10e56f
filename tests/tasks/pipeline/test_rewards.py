"""PPO's reward sources beside the reward model: a function by import path, a served model over
HTTP (a real server, a subprocess ended by its PID: up, down, back after a failure, refusing a
request) and the checks made before any training starts."""

from __future__ import annotations

import json
import re

import pytest

from rlhf_core.config import PPOConfig, RewardSource
from tasks.config.pipeline_config import ConfigError
from tasks.pipeline.rewards import (
    RewardSourceDown,
    check_reward_sources,
    post_rows,
    predictions,
    reward_mix,
)
from tests.servers import free_port, start_scoring_server, stop


@pytest.fixture()
def server():
    port = free_port()
    proc = start_scoring_server(port)
    yield f"http://127.0.0.1:{port}/invocations"
    stop(proc)


def http(url: str, **kw) -> RewardSource:
    return RewardSource(name="helpful", kind="http", target=url, **kw)


def test_a_served_model_scores_the_rows_and_abstains_on_null(server):
    assert post_rows(http(server), ["a", "b", "c"], ["xy", "", "abcd"]) == [2.0, None, 4.0]


def test_a_request_the_server_refuses_fails_at_once_with_its_answer(server):
    waits = []
    with pytest.raises(ValueError, match="refused the request: HTTP 400 no bad rows"):
        post_rows(http(server), ["bad"], ["x"], sleep=waits.append)
    assert waits == []


def test_a_server_that_stays_down_stops_the_run_after_its_retries():
    url = f"http://127.0.0.1:{free_port()}/invocations"
    waits = []
    with pytest.raises(RewardSourceDown, match="'helpful': .* did not answer after 4 tries"):
        post_rows(http(url, retries=3, timeout_s=2), ["a"], ["b"], sleep=waits.append)
    assert waits == [1.0, 2.0, 4.0]
    assert RewardSourceDown.stops_run  # rlhf_core lets it pass: the run stops resumably


def test_a_server_that_comes_back_within_the_retries_answers():
    port = free_port()
    procs = []

    def wait(seconds):  # the server starts during the first wait
        if not procs:
            procs.append(start_scoring_server(port))

    try:
        got = post_rows(http(f"http://127.0.0.1:{port}/invocations", retries=2),
                        ["p"], ["abc"], sleep=wait)
    finally:
        for p in procs:
            stop(p)
    assert got == [3.0] and len(procs) == 1


def test_mlflow_answers_of_each_shape_read_as_one_score_per_row():
    assert predictions({"predictions": [1, None, {"score": 2.5}]}) == [1, None, 2.5]
    assert predictions([0.5]) == [0.5]
    with pytest.raises(ValueError, match="expected a list of predictions, got str"):
        predictions({"predictions": "oops"})


def sources(*extra: dict) -> PPOConfig:
    return PPOConfig(reward_sources=[{"name": "rm"}, *extra])


@pytest.mark.parametrize("source, message", [
    ({"name": "f", "kind": "function", "target": "no_such_module_x:fn"},
     r"ppo.reward_sources\[f\]: no_such_module_x:fn: cannot import no_such_module_x "
     r"\(ModuleNotFoundError"),
    ({"name": "f", "kind": "function", "target": "tests.tasks.pipeline.reward_fns:nothing"},
     r"reward_fns has no function nothing"),
    ({"name": "h", "kind": "registered", "target": "models:/nobody@champion"},
     r"ppo.reward_sources\[h\]: no version of registered model 'nobody' holds alias "
     r"'champion'"),
])
def test_a_source_that_is_not_there_is_refused_before_training(source, message, tmp_path):
    with pytest.raises(ConfigError, match=message):
        check_reward_sources(sources(source), f"sqlite:///{tmp_path}/mlflow.db")


def test_a_registered_source_is_described_by_the_version_its_alias_holds(tmp_path):
    """``models:/<name>@<alias>`` resolves to ``<name> v<N>``, so a resume compares versions,
    not the version record's tags and timestamps."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri, uri)
    client.create_registered_model("big-rm")
    for _ in range(2):
        client.create_model_version("big-rm", str(tmp_path / "model"))
    client.set_registered_model_alias("big-rm", "champion", "2")
    source = {"name": "big", "kind": "registered", "target": "models:/big-rm@champion"}
    described = check_reward_sources(sources(source), uri)
    assert described["big"] == "registered models:/big-rm@champion, weight 1.0 [big-rm v2]"
    client.set_model_version_tag("big-rm", "2", "note", "a tag does not move the alias")
    assert check_reward_sources(sources(source), uri) == described

def test_an_endpoint_that_does_not_answer_is_refused_before_training(tmp_path):
    url = f"http://user:secret@127.0.0.1:{free_port()}/invocations"
    with pytest.raises(ConfigError, match=r"ppo.reward_sources\[h\]: http://user:\*\*\*@"
                       r"127.0.0.1:\d+/invocations does not answer \(.*refused") as err:
        check_reward_sources(sources({"name": "h", "kind": "http", "target": url}), "")
    assert "secret" not in str(err.value)


def test_each_source_is_described_by_what_identifies_it(server):
    described = check_reward_sources(sources(
        {"name": "f", "kind": "function", "target": "tests.tasks.pipeline.reward_fns:brevity",
         "weight": 0.5}, {"name": "h", "kind": "http", "target": server}), "")
    assert described["rm"] == "model the run's reward model, weight 1.0"
    assert re.fullmatch(r"function tests.tasks.pipeline.reward_fns:brevity, weight 0.5 "
                        r"\[sha256 [0-9a-f]{12}\]", described["f"])
    assert described["h"] == f"http {server}, weight 1.0"


def test_a_function_gets_the_prompts_as_the_data_hold_them_and_their_other_columns(server):
    from tests.tasks.pipeline import reward_fns

    rows = [{"prompt": [{"role": "user", "content": "hi"}], "ideal": "hello"},
            {"prompt": [{"role": "user", "content": "bye"}], "ideal": "goodbye"}]
    mix = reward_mix(sources(
        {"name": "f", "kind": "function", "target": "tests.tasks.pipeline.reward_fns:brevity"},
        {"name": "h", "kind": "http", "target": server}), rows, "")
    assert (mix.model_name, [s.name for s in mix.scorers]) == ("rm", ["f", "h"])
    f, h = mix.scorers
    reward_fns.CALLS.clear()
    assert f.score(["one two", ""], [1, 0]) == [-0.2, None]
    assert reward_fns.CALLS == [{"prompts": [rows[1]["prompt"], rows[0]["prompt"]],
                                 "completions": ["one two", ""],
                                 "ideal": ["goodbye", "hello"]}]
    assert h.score(["abc"], [0]) == [3.0]
    json.dumps(rows)  # the rows go to the server as JSON


@pytest.mark.parametrize("given, message", [
    ([{"name": "rm"}, {"name": "rm", "kind": "function", "target": "m:f"}], "each name once"),
    ([{"name": "a"}, {"name": "b"}], "the run's reward model \\(kind model\\) once"),
    ([{"name": "f", "kind": "function", "target": "m.f"}], "kind function takes module:function"),
    ([{"name": "h", "kind": "http", "target": "127.0.0.1:5000"}], "kind http takes an http"),
    ([{"name": "rm", "target": "x"}], "kind model takes no target"),
    ([], "at least 1 item"),
])
def test_sources_that_cannot_be_are_refused_naming_the_setting(given, message):
    with pytest.raises(ValueError, match=message):
        PPOConfig(reward_sources=given)


def test_a_registered_model_trained_against_cannot_be_the_gates_or_checks_scorer():
    from tasks.config.pipeline_config import load_config

    source = "ppo.reward_sources=[{name: rm}, {name: big, kind: registered, " \
        "target: 'models:/big-rm@champion'}]"
    assert load_config(None, [source]).ppo.reward_sources[1].name == "big"
    for key in ("retrain.gate.scorer", "ppo.health.scorer"):
        with pytest.raises(ConfigError, match=f"{key}=models:/big-rm@champion is "
                           r"ppo.reward_sources\[big\]: the policy is trained against it"):
            load_config(None, [source, f"{key}=models:/big-rm@champion"])


def test_a_resume_whose_function_changed_is_refused_and_an_unchanged_one_goes_on(tmp_path):
    from tasks.config.pipeline_config import load_config
    from tasks.pipeline.identity import ResumeRefused
    from tasks.pipeline.stages.ppo import reward_sources
    from tests.fake_stage import FakeStageContext

    (tmp_path / "prompts.jsonl").write_text('{"prompt": "hello :"}\n')
    cfg = load_config(None, ["ppo.reward_sources=[{name: rm}, {name: brevity, kind: function, "
                             "target: 'tests.tasks.pipeline.reward_fns:brevity'}]"])
    sc = FakeStageContext(cfg, "ppo", tmp_path)
    mix = reward_sources(sc, tmp_path)  # the first try tags what it trained with
    assert [s.name for s in mix.scorers] == ["brevity"]
    first = dict(sc.tags)
    assert reward_sources(sc, tmp_path) is not None and sc.tags == first  # unchanged
    sc.tags["rlhf.reward_source.brevity"] = first["rlhf.reward_source.brevity"].replace(
        "sha256 ", "sha256 0")  # the file was edited since
    with pytest.raises(ResumeRefused, match="ppo: a reward source changed since the run's "
                       "PPO began: brevity was 'function .*, now 'function"):
        reward_sources(sc, tmp_path)
    sc.tags["rlhf.reward_source.brevity"] = first["rlhf.reward_source.brevity"].replace(
        "weight 1.0", "weight 2.0")  # the resume's --set changed the weight: on purpose
    assert reward_sources(sc, tmp_path) is not None and sc.tags == first
    assert reward_sources(FakeStageContext(load_config(None, []), "ppo", tmp_path),
                          tmp_path) is None  # the reward model alone: as it always was
