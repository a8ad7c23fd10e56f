"""Resume identity: a run is continued only from the same config and the same data bytes."""

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tasks.config.pipeline_config import load_config
from tasks.pipeline.identity import ResumeRefused, input_digests
from tests.shared import ROOT

CONFIG = ROOT / "configs" / "test.yaml"


def _write(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def user_data(tmp_path):
    pairs = [{"prompt": f"user : tell me about cats {i} assistant :", "chosen": "cats are nice .",
              "rejected": "ugh ."} for i in range(64)]
    return {
        "sft": _write(tmp_path / "sft.jsonl", [{"prompt": "user : hi assistant :",
                                                "response": "sure ."}] * 8),
        "preference": _write(tmp_path / "pairs.jsonl", pairs),
        "prompts": _write(tmp_path / "prompts.jsonl", [{"prompt": "user : hi assistant :"}]),
    }


def _cfg(tmp_path, data: dict, *extra):
    sets = [f"data.{role}.path={path}" for role, path in data.items()]
    return load_config(CONFIG, [f"tracking.tracking_uri=sqlite:///{tmp_path}/m.db",
                                f"tracking.workdir={tmp_path}/runs", "tracking.run_name=same",
                                *sets, *extra])


def _grow_preference_file(data: dict) -> None:
    path = Path(data["preference"])
    path.write_text(path.read_text() * 2)  # 64 rows -> 128 rows, same path


@pytest.fixture
def no_flow_run(monkeypatch):
    import tasks.pipeline.prepare as prepare

    monkeypatch.setattr(prepare, "_prefect_flow_run_id", lambda: None)
    return prepare


def test_same_run_name_with_changed_data_starts_a_new_run_and_says_why(
        tmp_path, user_data, no_flow_run, capsys):
    first = no_flow_run.open_parent_run(_cfg(tmp_path, user_data), None)
    again = no_flow_run.open_parent_run(_cfg(tmp_path, user_data), None)
    assert again.parent_run_id == first.parent_run_id  # unchanged inputs: resumed
    _grow_preference_file(user_data)
    changed = no_flow_run.open_parent_run(_cfg(tmp_path, user_data), None)
    assert changed.parent_run_id != first.parent_run_id
    err = capsys.readouterr().err
    assert "preference data" in err and user_data["preference"] in err
    assert "sft data" not in err
    tags = MlflowClient(f"sqlite:///{tmp_path}/m.db").get_run(changed.parent_run_id).data.tags
    assert tags["rlhf.input_digest.preference"] != \
        MlflowClient(f"sqlite:///{tmp_path}/m.db").get_run(first.parent_run_id).data.tags[
            "rlhf.input_digest.preference"]


def test_same_run_name_with_changed_config_starts_a_new_run(tmp_path, user_data, no_flow_run):
    first = no_flow_run.open_parent_run(_cfg(tmp_path, user_data), None)
    other = no_flow_run.open_parent_run(_cfg(tmp_path, user_data, "seed=1"), None)
    assert other.parent_run_id != first.parent_run_id


def test_explicit_resume_after_the_data_changed_is_refused_naming_the_file(
        tmp_path, user_data, no_flow_run):
    first = no_flow_run.open_parent_run(_cfg(tmp_path, user_data), None)
    _grow_preference_file(user_data)
    with pytest.raises(ResumeRefused, match="preference data") as err:
        no_flow_run.open_parent_run(_cfg(tmp_path, user_data), first.parent_run_id)
    assert user_data["preference"] in str(err.value)
    assert "sft data" not in str(err.value)


def test_demo_data_digest_follows_the_generator_settings(tmp_path):
    base = load_config(CONFIG, [])
    assert input_digests(base) == input_digests(load_config(CONFIG, []))
    bigger = input_digests(load_config(CONFIG, ["demo.n_pref=129"]))
    assert bigger["preference"] != input_digests(base)["preference"]
    assert bigger["sft"] == input_digests(base)["sft"]
