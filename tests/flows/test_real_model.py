"""The real model a package ships (SmolLM2-135M-Instruct's GGUF file) through the whole pipeline
on the real-English example (configs/smollm2.yaml) with LoRA adapters in every trained stage
(GAE's critic too, which the example's RLOO does not train) and the pretraining mix on, at the
smallest sizes: each stage saves only what it trained,
naming the folder it adapts; the alignment tax is measured on base, SFT and policy; the
registered policy serves from its bundle (the base named by its source and digest); a run
killed mid-PPO resumes to the same adapter weights."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.conftest import SMOLLM2
from tests.shared import ROOT

SMALL = ["data.sft.limit=16", "data.preference.limit=16", "data.prompts.limit=16",
         "data.eval_prompts.limit=8", "data.preference_eval.limit=8", "sft.batch_size=8",
         "data.pretrain.path=configs/pretrain/general-english.txt", "ppo.ptx_coef=1.0",
         "ppo.ptx_max_tokens=32", "eval.tax.max_new_tokens=6", "reward.batch_size=8",
         "ppo.iterations=2", "ppo.advantage_estimator=gae", "ppo.samples_per_prompt=1",
         "ppo.rollout_batch_size=4", "ppo.num_minibatches=1", "ppo.ppo_epochs=1",
         "ppo.max_new_tokens=6", "ppo.eval_every=1", "ppo.eval_prompts=8",
         "ppo.checkpoint_every=1", "eval.num_prompts=8", "eval.max_new_tokens=6",
         "model.torch_threads=2", "tracking.progress=false",
         "tracking.experiment=rlhf-real-model", "tracking.keep_resume_state=true"]
CONFIG = ROOT / "configs" / "smollm2.yaml"


def args(workdir: Path, extra: list[str] = ()) -> list[str]:
    out = ["run", "--config", str(CONFIG)]
    for item in [*SMALL, f"tracking.workdir={workdir}", *extra]:
        out += ["--set", item]
    return out


def adapter_hash(folder: Path) -> str:
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode() + tensors[name].contiguous().numpy().tobytes())
    return digest.hexdigest()


def run(env: dict, argv: list[str], crash_at: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", *argv], cwd=ROOT, timeout=1200,
                          env={**env, "RLHF_CRASH_AT": crash_at}, capture_output=True,
                          text=True)


@pytest.fixture(scope="module")
def env(smollm2, prefect_api, tmp_path_factory) -> dict:
    uri = f"sqlite:///{tmp_path_factory.mktemp('store')}/mlflow.db"
    return {**os.environ, "PREFECT_API_URL": prefect_api, "MLFLOW_TRACKING_URI": uri,
            "PREFECT_LOGGING_LEVEL": "WARNING", "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def whole(env, tmp_path_factory) -> Path:
    """One uninterrupted run -> its run folder."""
    workdir = tmp_path_factory.mktemp("whole")
    proc = run(env, args(workdir, ["tracking.run_name=whole"]))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (folder,) = [p for p in workdir.iterdir() if p.is_dir()]
    return folder


def test_the_run_measures_the_alignment_tax_and_mixes_in_pretraining(whole, env):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    (parent,) = [r for r in client.search_runs(
        [client.get_experiment_by_name("rlhf-real-model").experiment_id],
        "tags.`mlflow.runName` = 'whole'")]
    m = parent.data.metrics
    for name in ("base", "sft", "policy"):
        assert 0 <= m[f"eval/tax/probe_acc_{name}"] <= 1 and 0 < m[f"eval/tax/bpb_{name}"] < 8
    assert parent.data.tags.get("rlhf.base_model") is None  # a version tag, not the run's
    (ppo,) = client.search_runs([parent.info.experiment_id],
                                f"tags.`mlflow.parentRunId` = '{parent.info.run_id}' and "
                                "tags.`rlhf.stage` = 'ppo'")
    assert [h.step for h in client.get_metric_history(ppo.info.run_id, "ptx/loss")] == [1, 2]
    version = client.get_model_version("smollm2-policy", "1")
    assert version.tags["rlhf.base_model"] == SMOLLM2


def test_every_trained_stage_saves_its_adapter_alone(whole):
    import json

    chain = {"sft/model": "causal_lm", "reward_model/model": "scalar",
             "ppo/policy": "causal_lm", "ppo/value_model": "scalar"}
    for stage, kind in chain.items():
        folder = whole / stage
        meta = json.loads((folder / "rlhf_lora.json").read_text())
        assert meta["kind"] == kind, stage
        assert not (folder / "model.safetensors").exists(), stage  # no copy of the base
        assert not (folder / "backbone").exists(), stage
    assert json.loads((whole / "sft/model/rlhf_lora.json").read_text())["source"] == SMOLLM2
    bases = {s: json.loads((whole / s / "rlhf_lora.json").read_text())["base"] for s in chain}
    assert bases["reward_model/model"] == bases["ppo/policy"] == str(whole / "sft/model")
    assert bases["ppo/value_model"] == str(whole / "reward_model/model")
    assert not (whole / "critic_init" / "model").exists()  # the critic starts as the RM


def test_the_registered_policy_serves_from_its_bundle(whole, env):
    import mlflow
    import pandas as pd

    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    model = mlflow.pyfunc.load_model("models:/smollm2-policy/1")
    answers = model.predict(pd.DataFrame({"prompt": [[{"role": "user",
                                                       "content": "describe cats"}]]}),
                            params={"max_new_tokens": 4, "do_sample": False})
    # a conversation in, the assistant's message out
    assert len(answers) == 1 and answers[0]["role"] == "assistant"
    assert isinstance(answers[0]["content"], str) and answers[0]["content"]
    bundle = Path(model._model_impl.context.artifacts["policy"])
    weights = sorted(p.relative_to(bundle).as_posix() for p in bundle.rglob("*.safetensors"))
    assert weights == ["adapter_model.safetensors", "base/adapter_model.safetensors",
                       "base/embeddings.safetensors"]  # the PAD's resized rows, once


def test_a_kill_mid_ppo_resumes_to_the_uninterrupted_adapters(whole, env, tmp_path):
    workdir = tmp_path / "killed"
    killed = run(env, args(workdir, ["tracking.run_name=killed"]), crash_at="ppo:rollout:2")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = run(env, args(workdir, ["tracking.run_name=killed"]))
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    (folder,) = [p for p in workdir.iterdir() if p.is_dir()]
    for stage in ("ppo/policy", "ppo/value_model"):
        assert adapter_hash(folder / stage) == adapter_hash(whole / stage), stage
