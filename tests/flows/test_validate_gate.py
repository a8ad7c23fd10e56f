"""The gate inside the pipeline: a failed expectation stops `rlhf_pipeline` at validate, with
the GX results logged, and nothing is checkpointed, registered or aliased. (`rlhf validate`
itself: tests/flows/test_cli_validate.py.)"""

import pytest
import yaml
from mlflow.tracking import MlflowClient

from data_checks.validate import ValidationFailed
from flows.config import load_config
from flows.pipeline import rlhf_pipeline
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


def test_pipeline_stops_at_the_gate_without_checkpoints_or_registry(tmp_path, tiny_model_dir,
                                                                    prefect_api):
    config = write_config(tmp_path, tiny_model_dir,
                          pref=[{**PREF[0], "rejected": PREF[0]["chosen"]}, PREF[1]])
    with pytest.raises(ValidationFailed, match="chosen == rejected"):
        rlhf_pipeline(config=load_config(config, []))
    client, parents, runs = parent_runs(tmp_path)
    assert parents[0].info.status == "FAILED"
    assert {r.data.tags.get("rlhf.stage") for r in runs} == {None, "validate"}
    (child,) = [r for r in runs if r.data.tags.get("rlhf.stage") == "validate"]
    assert child.info.status == "FAILED"
    files = {a.path for a in client.list_artifacts(child.info.run_id)} | \
        {a.path for a in client.list_artifacts(child.info.run_id, "data_docs")}
    assert {"validation_summary.md", "data_docs/results.json", "data_docs/gx"} <= files
    workdir = tmp_path / "runs" / parents[0].info.run_id
    assert sorted(p.name for p in workdir.iterdir()) == ["validate"]
    assert not list(workdir.rglob("*.safetensors"))
    assert client.search_registered_models() == []
