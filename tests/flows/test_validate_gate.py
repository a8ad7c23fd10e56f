"""`rlhf validate` and the gate inside `rlhf run`: bad data stops everything before training,
with a clear message and exit code; nothing is checkpointed or registered."""

import json

import pytest
import yaml
from mlflow.tracking import MlflowClient

from data_checks.validate import ValidationFailed
from flows.cli import main
from flows.config import load_config
from flows.pipeline import rlhf_pipeline  # imported outside capsys: Prefect binds its log
from flows.validate import rlhf_validate  # noqa: F401  handler to the stderr of import time
from tests.data_checks.test_validate import PREF, PROMPTS, SFT, write_jsonl


def write_config(tmp, model_dir, pref=PREF, sft_text=None):
    sft_path = tmp / "sft.jsonl"
    if sft_text is None:
        write_jsonl(sft_path, SFT)
    else:
        sft_path.write_text(sft_text)
    cfg = {
        "model": {"base_model": str(model_dir), "device": "cpu"},
        "data": {"sft": {"path": str(sft_path)},
                 "preference": {"path": str(write_jsonl(tmp / "pref.jsonl", pref))},
                 "prompts": {"path": str(write_jsonl(tmp / "prompts.jsonl", PROMPTS))}},
        "validation": {"max_prompt_tokens": 8, "max_response_tokens": 8},
        "sft": {"epochs": 1, "batch_size": 2}, "reward": {"epochs": 1, "batch_size": 2},
        "ppo": {"iterations": 1, "rollout_batch_size": 2, "num_minibatches": 1,
                "max_new_tokens": 4},
        "eval": {"num_prompts": 2, "max_new_tokens": 4},
        "tracking": {"tracking_uri": f"sqlite:///{tmp}/mlflow.db", "workdir": str(tmp / "runs"),
                     "experiment": "gate", "progress": False, "system_metrics": False},
    }
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def parent_runs(tmp):
    client = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    exp = client.get_experiment_by_name("gate")
    runs = client.search_runs([exp.experiment_id]) if exp else []
    return client, [r for r in runs if "mlflow.parentRunId" not in r.data.tags], runs


def test_malformed_file_exits_2_naming_file_and_line_before_anything_starts(
        tmp_path, tiny_model_dir, capsys):
    config = write_config(tmp_path, tiny_model_dir, sft_text='{"prompt": "a"\n')
    for command in ("validate", "run"):
        assert main([command, "--config", str(config)]) == 2
        err = capsys.readouterr().err
        assert f"{tmp_path / 'sft.jsonl'} line 1: invalid JSON" in err
        assert "Traceback" not in err
    assert parent_runs(tmp_path)[1] == []  # nothing tracked, nothing started


def test_validate_passes_on_good_data_and_logs_docs(tmp_path, tiny_model_dir, capsys,
                                                    prefect_api):
    config = write_config(tmp_path, tiny_model_dir)
    assert main(["validate", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "data validation PASSED" in out and "rows kept: sft 2, preference 2" in out
    client, parents, runs = parent_runs(tmp_path)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert parents[0].data.tags["rlhf.validate_only"] == "true"
    (child,) = [r for r in runs if r.data.tags.get("rlhf.stage") == "validate"]
    files = {a.path for a in client.list_artifacts(child.info.run_id, "data_docs")}
    assert "data_docs/index.html" in files and "data_docs/results.json" in files
    assert not (tmp_path / "runs" / parents[0].info.run_id / "sft").exists()


def test_validate_fails_with_exit_1_naming_every_failed_expectation(tmp_path, tiny_model_dir,
                                                                    capsys, prefect_api):
    bad = [{**PREF[0], "rejected": PREF[0]["chosen"]}, {**PREF[1], "chosen": ""}]
    config = write_config(tmp_path, tiny_model_dir, pref=bad)
    assert main(["validate", "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert "chosen_equals_rejected" in err and "expect_column_value_lengths_to_be_between" in err
    assert "row 1" in err
    client, parents, runs = parent_runs(tmp_path)
    assert parents[0].info.status == "FAILED"
    (child,) = [r for r in runs if r.data.tags.get("rlhf.stage") == "validate"]
    docs = client.download_artifacts(child.info.run_id, "data_docs/results.json",
                                     str(tmp_path / "dl"))
    assert json.loads(open(docs).read())["preference"]["success"] is False
    # the Prefect UI shows the verdict too, failures and all
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        ArtifactFilterKey,
    )

    flow_run_id = parents[0].data.tags["rlhf.prefect_flow_run_id"]
    with get_client(sync_client=True) as prefect:
        (artifact,) = prefect.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=["rlhf-data-validation"]),
            flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    assert artifact.type == "markdown" and "FAILED" in artifact.data
    assert "chosen_equals_rejected" in artifact.data and child.info.run_id in artifact.data


def test_pipeline_stops_at_the_gate_without_checkpoints_or_registry(tmp_path, tiny_model_dir,
                                                                    prefect_api):
    config = write_config(tmp_path, tiny_model_dir,
                          pref=[{**PREF[0], "rejected": PREF[0]["chosen"]}, PREF[1]])
    with pytest.raises(ValidationFailed, match="chosen_equals_rejected"):
        rlhf_pipeline(config=load_config(config, []))
    client, parents, runs = parent_runs(tmp_path)
    assert parents[0].info.status == "FAILED"
    assert {r.data.tags.get("rlhf.stage") for r in runs} == {None, "validate"}
    workdir = tmp_path / "runs" / parents[0].info.run_id
    assert sorted(p.name for p in workdir.iterdir()) == ["validate"]
    assert not list(workdir.rglob("*.safetensors"))
    assert client.search_registered_models() == []
