"""What several test modules share (small data rows and files, config paths, tracking look-ups),
so no test module imports another. Fixtures built from these live in conftest.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from unittest import mock

import yaml
from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[1]
TEST_CONFIG = ROOT / "configs" / "test.yaml"  # the tiny end-to-end config


def pipeline_stages() -> list[str]:
    """The stages the pipeline flow runs (its held-out checks' judge included): the
    pipeline's stage table."""
    from tasks.pipeline.stages.table import STAGES

    return list(STAGES)


def every_stage() -> dict:
    """Every stage a run can have: the pipeline's table, then the retrain's gate (the
    order of docs/design.md's stage sections)."""
    from tasks.pipeline.stages.table import STAGES
    from tasks.retrain.gate.stage import STAGE as GATE

    return {**STAGES, GATE.name: GATE}


def ppo_iteration_metrics() -> list[str]:
    """What the ppo stage logs every iteration under the test configs (GAE, no KL loss term,
    no pretraining mix, the reward model alone): its table entry's metrics less the end's
    ``memory/*``, the gold judge's ``judge/*``, the held-out checks' ``check/*`` and the
    reward sources' ``reward/*``."""
    from tasks.pipeline.stages.table import STAGES

    return [m for m in STAGES["ppo"].metrics
            if not m.startswith(("memory/", "judge/", "check/", "reward/"))
            and m not in ("loss/kl_loss_avg", "time/check_s", "ptx/loss")]

# smaller than configs/test.yaml, for tests of concurrent runs on one store (the point is the
# shared store, not the training): 2 PPO iterations, 8 evaluation prompts, one thread per run
CONCURRENT_RUN = ["demo.n_sft=64", "demo.n_pref=64", "demo.n_prompts=32", "demo.n_eval=8",
                  "demo.n_pref_eval=16", "ppo.iterations=2", "eval.num_prompts=8",
                  "tracking.system_metrics=false", "model.torch_threads=1"]

SFT = [{"prompt": "tell me about cats :", "response": "cats are nice ."},
       {"prompt": "tell me about dogs :", "response": "dogs are good !"}]
PREF = [{"prompt": "tell me about cats :", "chosen": "cats are nice .", "rejected": "bad"},
        {"prompt": "tell me about rain :", "chosen": "rain is good .", "rejected": "sun"}]
PROMPTS = [{"prompt": "tell me about sun :"}, {"prompt": "hello :"}]


def rlhf_in_process(args: list[str], capfd, **env: str) -> subprocess.CompletedProcess:
    """`rlhf ARGS` run by ``cli.main.main`` in this process, with ``env`` added to the
    environment (all of it restored afterwards, with what main() set) -> its exit code and what
    it wrote to stdout and stderr, caught at the file descriptors (a log handler's lines too).
    For a run whose test is about what it does, not about being a process of its own (exit by
    signal, a separate environment): it saves the new process's imports."""
    from cli.main import main

    capfd.readouterr()
    with mock.patch.dict(os.environ, env):
        code = main(list(args))
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_config(tmp: Path, model_dir, pref=PREF, sft_text=None) -> Path:
    """A one-step pipeline config on the small rows above and a given model folder
    (experiment 'gate', MLflow in tmp/mlflow.db)."""
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


def parent_runs(tmp: Path):
    """(client, parent runs, all runs) of experiment 'gate' in tmp/mlflow.db."""
    client = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    exp = client.get_experiment_by_name("gate")
    runs = client.search_runs([exp.experiment_id]) if exp else []
    return client, [r for r in runs if "mlflow.parentRunId" not in r.data.tags], runs


def child_runs_by_stage(client: MlflowClient, parent_run_id: str) -> dict:
    """{stage: child run} under a pipeline parent run."""
    parent = client.get_run(parent_run_id)
    runs = client.search_runs([parent.info.experiment_id],
                              f"tags.`mlflow.parentRunId` = '{parent_run_id}'")
    return {r.data.tags["rlhf.stage"]: r for r in runs}


def registered_models_panel(client: MlflowClient, run_id: str) -> set[tuple[str, str]]:
    """{(model name, version)} the MLflow 3 run page shows under "Registered models": the
    versions whose run_id is the run (searchModelVersions by run_id), plus the versions
    (logged-model tag ``mlflow.modelVersions``) of the logged models that the run lists as
    inputs or outputs (mlflow/server/js: the run page's registeredModelVersionSummaries and
    its loggedModelsV3 read through useLoggedModelRegistrations)."""
    shown = {(v.name, str(v.version))
             for v in client.search_model_versions(f"run_id = '{run_id}'")}
    run = client.get_run(run_id)
    models = [*(run.inputs.model_inputs or []), *(run.outputs.model_outputs or [])]
    for model_id in {m.model_id for m in models}:
        tag = client.get_logged_model(model_id).tags.get("mlflow.modelVersions", "[]")
        shown |= {(v["name"], str(v["version"])) for v in json.loads(tag)}
    return shown


def label_agreement(rows: list[dict]) -> float:
    """Fraction of (non-tied) demo preference pairs whose label agrees with the noiseless
    gold judge."""
    from rlhf_core.demo import judge_score

    judged = [(judge_score(r["prompt"], r["chosen"]), judge_score(r["prompt"], r["rejected"]))
              for r in rows]
    judged = [(a, b) for a, b in judged if a != b]
    return sum(a > b for a, b in judged) / len(judged) if judged else float("nan")


# -- data-parallel equivalence tests (tests/rlhf_core/test_distributed.py, test_fsdp.py) ------
DP_WORDS = "hello world tell me about cats dogs rain sun please thanks sure nice good bad".split()


def dp_rows(n: int = 5) -> list[dict]:
    """Rows whose responses differ in length, so the shards' token counts differ."""
    rows = []
    for i in range(n):
        resp = " ".join(DP_WORDS[(i + j) % len(DP_WORDS)] for j in range(1 + 2 * i))
        rows.append({"prompt": f"user : tell me about {DP_WORDS[i]} assistant :",
                     "response": resp, "chosen": resp, "rejected": DP_WORDS[-1 - i]})
    return rows


def dp_initial(model_dir, stage: str):
    """The stage's model before training: the policy, or a fresh scalar head (seeded)."""
    import torch

    from rlhf_core.models.loader import LoadSpec, load_pretrained

    torch.manual_seed(0)  # the RM's fresh head
    if stage == "sft":
        return load_pretrained(model_dir, LoadSpec())
    return load_pretrained(model_dir, LoadSpec(), "new_head")


def dp_train(model_dir, stage: str, batch_size: int, dp, ck_root=None, on_log=None):
    """One epoch of ``stage`` (sft | reward_model) on :func:`dp_rows` from the same initial
    weights, on this rank's shard when ``dp`` is set -> (last metrics, state dict)."""
    import torch

    from rlhf_core.config import OptimConfig, RewardConfig, SFTConfig
    from rlhf_core.models.checkpoint import Checkpointer
    from rlhf_core.models.loader import LoadSpec, load_tokenizer
    from rlhf_core.train.reward import encode_pairs, train_reward_model
    from rlhf_core.train.sft import encode_sft_rows, train_sft

    optim = OptimConfig(lr=1e-2, warmup_ratio=0.0, schedule="constant")
    tok = load_tokenizer(model_dir, LoadSpec())
    model = dp_initial(model_dir, stage)
    gen, cpu = torch.Generator().manual_seed(0), torch.device("cpu")
    if stage == "sft":
        ck = None if ck_root is None else Checkpointer(ck_root, {"model": model}, every=1)
        cfg = SFTConfig(batch_size=batch_size, epochs=1, optim=optim, log_every=1)
        examples = encode_sft_rows(tok, dp_rows(), cfg.loss_on)
        last = train_sft(model, examples, tok.pad_token_id, cfg, cpu, gen, on_log=on_log,
                         progress=False, checkpointer=ck, dp=dp)
    else:
        cfg = RewardConfig(batch_size=batch_size, epochs=1, optim=optim)
        pairs = encode_pairs(tok, dp_rows())
        last = train_reward_model(model, pairs, None, tok.pad_token_id, cfg, cpu, gen,
                                  progress=False, dp=dp)
    return last, {k: v.detach().clone() for k, v in model.state_dict().items()}



def assert_decision_follows_figures(tags: dict, margin: float = 0.0,
                                    prefix: str = "rlhf.gate.") -> str:
    """The gate's recorded decision is the one its recorded figures lead to: promote exactly
    when no guard rail failed and the interval's lower end is above ``margin`` (machine-free:
    other CPUs give other figures, never another rule) -> the decision."""
    decision, low = tags[prefix + "decision"], float(tags[prefix + "ci_low"])
    # the gold judge's figures carry no reason: its guard rails are the gate's own
    guarded = "guard rail" in tags.get(prefix + "reason", tags.get("rlhf.gate.reason", ""))
    assert decision == ("promote" if low > margin and not guarded else "keep"), tags
    return decision


def length_scorer():
    """A stand-in external judge, as an MLflow pyfunc: the longer response scores higher."""
    import mlflow.pyfunc

    class LengthScorer(mlflow.pyfunc.PythonModel):
        def predict(self, context, model_input, params=None):
            return [float(len(r)) for r in model_input["response"]]

    return LengthScorer()


class Interrupt(Exception):
    """Raised from a training callback to stand for a crash."""


def weights(model) -> dict:
    """A model's state, cloned (to compare bit for bit after more training)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_bits(a: dict, b: dict) -> None:
    import torch

    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def prepared_for(cfg, work, data, model_dir):
    """What prepare resolves for these rows and this model (no parent run: a fake stage
    context has none)."""
    from tasks.pipeline.prepare import Prepared
    from tasks.platform.mlflow.runs import RunContext

    ctx = RunContext(tracking_uri=f"sqlite:///{work}/mlflow.db", experiment_id="0",
                     parent_run_id="parent", workdir=str(work), seed=cfg.seed)
    return Prepared(ctx=ctx, data=data, base_model=str(model_dir), tokenizer=str(model_dir),
                    judge="none")
