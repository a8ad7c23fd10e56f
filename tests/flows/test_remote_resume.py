"""A resume on a machine without the finished stages' folders: the pipeline is SIGKILLed after
the reward model, the validate/sft/reward_model folders are deleted (the MLflow store and its
artifacts stay: what every worker can reach), and ``--resume`` finishes from the artifacts
alone, with the same final policy as a run that kept its folders."""

import hashlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from mlflow.tracking import MlflowClient
from safetensors.torch import load_file

from tasks.config.pipeline_config import load_config
from tests.shared import pipeline_stages, rlhf_in_process
from tests.stores import seed_sqlite_store

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "test.yaml"
OVERRIDES = ["model.torch_threads=2", "tracking.register_models=false", "ppo.iterations=2",
             "eval.num_prompts=8"]
GONE = ("validate", "sft", "reward_model")


def weights_hash(folder: Path) -> str:
    """Every tensor of every safetensors file under ``folder`` (a policy, or a scalar-head
    model's backbone and head)."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*.safetensors")):
        tensors = load_file(str(path))
        for name in sorted(tensors):
            digest.update(f"{path.relative_to(folder)}:{name}".encode())
            digest.update(tensors[name].contiguous().numpy().tobytes())
    return digest.hexdigest()


def run_args(args: list[str]) -> list[str]:
    return ["run", "--config", str(CONFIG), *[a for o in OVERRIDES for a in ("--set", o)], *args]


def rlhf_cli(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", *run_args(args)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def children(client: MlflowClient, parent) -> dict:
    runs = client.search_runs([parent.info.experiment_id],
                              filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    return {r.data.tags["rlhf.stage"]: r for r in runs}


def test_resume_without_local_stage_folders_downloads_them(prefect_api, tmp_path, capfd,
                                                           threads_kept):
    from flows.pipeline import rlhf_pipeline

    uri = f"sqlite:///{tmp_path}/remote.db"
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "MLFLOW_TRACKING_URI": uri,
           "PREFECT_LOGGING_LEVEL": "WARNING", "TOKENIZERS_PARALLELISM": "false"}
    base = ["--set", f"tracking.workdir={tmp_path}/work", "--set", "tracking.run_name=remote"]
    seed_sqlite_store(uri)
    proc = rlhf_cli(base, {**env, "RLHF_CRASH_AT": "after:reward_model"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    client = MlflowClient(uri)
    (parent,) = client.search_runs([client.get_experiment_by_name("rlhf-test").experiment_id],
                                   filter_string="tags.`rlhf.run_name` = 'remote'")
    run_id, workdir = parent.info.run_id, tmp_path / "work" / parent.info.run_id
    logged = {s: weights_hash(workdir / s / "model") for s in ("sft", "reward_model")}
    ended = {s: r.info.end_time for s, r in children(client, parent).items()}
    assert set(ended) == set(GONE)
    for stage in GONE:  # "another machine": the finished stages' folders are not here
        shutil.rmtree(workdir / stage)

    # the resume runs in this process, which never saw those folders (no new process needed)
    proc = rlhf_in_process(run_args(base + ["--resume", run_id]), capfd,
                           PREFECT_API_URL=prefect_api, MLFLOW_TRACKING_URI=uri,
                           RLHF_CRASH_AT="")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    parent = client.get_run(run_id)
    assert parent.info.status == "FINISHED"
    runs = children(client, parent)
    assert sorted(runs) == sorted(pipeline_stages())
    assert all(r.info.status == "FINISHED" for r in runs.values())
    # the three finished stages were skipped (not re-run, their folders not re-made) ...
    assert {s: runs[s].info.end_time for s in GONE} == ended
    assert not any((workdir / s).exists() for s in GONE)
    # ... and their outputs came from MLflow into the cache, the same weights as logged
    cached = list((workdir / "artifact_cache").glob("*/*"))
    assert sorted(p.name for p in cached) == ["checkpoint", "checkpoint", "data", "tokenizer"]
    downloaded = sorted(weights_hash(p) for p in cached if p.name == "checkpoint")
    assert downloaded == sorted(logged.values())
    # the critic is a copy of the downloaded reward model, and says where it came from
    assert weights_hash(workdir / "critic_init" / "model") == logged["reward_model"]
    rm_uri = f"runs:/{runs['reward_model'].info.run_id}/checkpoint"
    assert runs["critic_init"].data.tags["rlhf.critic_source"] == rm_uri

    # the same final policy as an uninterrupted run that kept its folders
    cfg = load_config(CONFIG, OVERRIDES + [f"tracking.tracking_uri=sqlite:///{tmp_path}/a.db",
                                           f"tracking.workdir={tmp_path}/a"])
    reference = Path(rlhf_pipeline(config=cfg).workdir)
    assert not (reference / "artifact_cache").exists()  # everything was local there
    assert weights_hash(workdir / "ppo" / "policy") == weights_hash(reference / "ppo" / "policy")
