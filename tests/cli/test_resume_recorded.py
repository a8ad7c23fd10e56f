"""`rlhf run --resume <id>` as the README gives it, with no --config: a run of a user's own
config file (own data, own base model, no demo) is SIGKILLed in its data gate (mid-chunk,
with the gate's unfinished files on disk), in SFT and in PPO; each time the bare `rlhf run
--resume <id>` continues it from the config the run recorded in MLflow, and the last one
finishes it. A --config that differs from the run's is refused, naming the keys that differ,
not the data."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient
from transformers import GPT2Config, GPT2LMHeadModel

from tests.conftest import make_tokenizer
from tests.shared import ROOT, pipeline_stages, rlhf_in_process, write_jsonl

PAIRS = 30_000  # two of the gate's chunks (25,000 rows each) of preference pairs


def own_config(tmp: Path) -> Path:
    """A user's config file: a tiny GPT-2 folder and JSONL data (every row distinct), small
    fractions of an epoch, 3 PPO iterations; MLflow through MLFLOW_TRACKING_URI."""
    tok = make_tokenizer()
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=1,
                               n_head=2, bos_token_id=tok.eos_token_id,
                               eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
                    ).save_pretrained(tmp / "base")
    tok.save_pretrained(tmp / "base")
    topics = ("cats", "dogs", "rain", "sun")
    data = {
        "sft": [{"prompt": f"tell me about {topics[i % 4]} {i} :",
                 "response": f"{topics[i % 4]} are nice ."} for i in range(400)],
        "preference": [{"prompt": f"tell me about {topics[i % 4]} {i} :",
                        "chosen": f"{topics[i % 4]} are good !", "rejected": "bad ."}
                       for i in range(PAIRS)],
        "prompts": [{"prompt": f"hello tell me about {topics[i % 4]} {i} :"}
                    for i in range(200)],
    }
    cfg = {
        "model": {"base_model": str(tmp / "base"), "device": "cpu", "torch_threads": 1},
        "data": {name: {"path": str(write_jsonl(tmp / f"{name}.jsonl", rows))}
                 for name, rows in data.items()},
        "validation": {"max_prompt_tokens": 12, "max_response_tokens": 8},
        "sft": {"epochs": 0.5, "batch_size": 16, "log_every": 1, "checkpoint_every": 2},
        "reward": {"epochs": 0.005, "batch_size": 16, "log_every": 1},
        "reward_norm": {"max_samples": 64},
        "ppo": {"iterations": 3, "rollout_batch_size": 8, "num_minibatches": 1,
                "ppo_epochs": 1, "max_new_tokens": 6, "checkpoint_every": 1},
        "eval": {"num_prompts": 8, "max_new_tokens": 6},
        "tracking": {"experiment": "own", "workdir": str(tmp / "runs"), "progress": False,
                     "system_metrics": False, "register_models": False},
    }
    path = tmp / "my.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def rlhf(args: list[str], env: dict, crash_at: str = "") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cli", *args], cwd=ROOT, text=True,
                            env={**env, "RLHF_CRASH_AT": crash_at}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def killed_in_the_gate(proc: subprocess.Popen, runs: Path, timeout_s: float = 600) -> Path:
    """SIGKILL ``proc`` once its gate is writing its cleaned files (``*.part``) -> them."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        parts = sorted(runs.glob("*/validate/*.part"))
        if parts:
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=60)
            return parts
        time.sleep(0.02)
    out, err = proc.communicate(timeout=60)
    raise AssertionError(f"the gate wrote no .part file to kill it at: {err[-3000:]}")


@pytest.fixture
def own(tmp_path, prefect_api):
    """(config file, environment of the commands, MLflow client)."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    # a validation cache of its own: a gate another test passed on the same data is reused
    # whole, and writes nothing to kill it at
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "MLFLOW_TRACKING_URI": uri,
           "PREFECT_LOGGING_LEVEL": "WARNING", "TOKENIZERS_PARALLELISM": "false",
           "RLHF_VALIDATION_CACHE": str(tmp_path / "validation_cache")}
    return own_config(tmp_path), env, MlflowClient(uri)


def test_bare_resume_continues_from_the_runs_own_config_after_kills_in_gate_sft_and_ppo(
        own, tmp_path, capfd, threads_kept):
    config, env, client = own
    parts = killed_in_the_gate(rlhf(["run", "--config", str(config)], env), tmp_path / "runs")
    run_id = parts[0].parents[1].name
    assert client.get_run(run_id).info.status == "RUNNING"  # killed: nothing ended it

    for point in ("sft:step:3", "ppo:rollout:2"):  # `rlhf run --resume <id>`, as the README
        proc = rlhf(["run", "--resume", run_id], env, crash_at=point)
        _, err = proc.communicate(timeout=900)
        assert proc.returncode == -signal.SIGKILL, f"{point}: {err[-3000:]}"
        assert "changed since it began" not in err
    finished = rlhf_in_process(["run", "--resume", run_id], capfd, **{k: env[k] for k in (
        "PREFECT_API_URL", "MLFLOW_TRACKING_URI", "RLHF_VALIDATION_CACHE")}, RLHF_CRASH_AT="")
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "Traceback" not in finished.stderr

    parent = client.get_run(run_id)
    assert parent.info.status == "FINISHED"
    assert "rlhf.resumed_config_hash" not in parent.data.tags  # the same config throughout
    children = client.search_runs([parent.info.experiment_id],
                                  f"tags.`mlflow.parentRunId` = '{run_id}'")
    by_stage = {r.data.tags["rlhf.stage"]: r for r in children}
    assert len(children) == len(by_stage) and sorted(by_stage) == sorted(pipeline_stages())
    assert by_stage["validate"].data.metrics["preference/n_rows"] == PAIRS
    for stage, key in (("sft", "train/loss"), ("ppo", "objective/kl")):
        steps = [m.step for m in client.get_metric_history(by_stage[stage].info.run_id, key)]
        assert steps == sorted(set(steps)) and steps[0] == 1, (stage, steps)
    workdir = tmp_path / "runs" / run_id
    assert not list(workdir.rglob("*.part"))  # the resumed gate replaced the killed one's
    assert (workdir / "ppo" / "policy" / "model.safetensors").is_file()


def test_resume_with_a_config_that_differs_names_the_keys_not_the_data(own, tmp_path, capfd):
    config, env, client = own
    parts = killed_in_the_gate(rlhf(["run", "--config", str(config)], env), tmp_path / "runs")
    run_id = parts[0].parents[1].name
    other = yaml.safe_load(config.read_text())
    other["ppo"]["kl_coef"] = 0.2
    other["data"]["prompts"]["path"] = str(tmp_path / "sft.jsonl")
    changed = tmp_path / "other.yaml"
    changed.write_text(yaml.safe_dump(other))
    sets = {k: env[k] for k in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI")}

    refused = rlhf_in_process(["run", "--config", str(changed), "--resume", run_id], capfd,
                              **sets)
    assert refused.returncode == 2
    err = refused.stderr
    assert f"cannot resume run {run_id} with --config {changed}" in err
    assert "ppo.kl_coef (0.2 here, 0.05 in the run)" in err
    assert f'data.prompts.path ({json.dumps(str(tmp_path / "sft.jsonl"))} here' in err
    assert "digest" not in err and "Traceback" not in err
    assert client.get_run(run_id).info.status == "RUNNING"  # untouched
