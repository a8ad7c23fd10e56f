"""judge_model (a retrain's stage): the gate's judge reward model, trained on the pairs the
judge split held out, so it shares no training pair with the reward model the challenger
was optimised against."""

from __future__ import annotations

from prefect import task

from rlhf_core.models.checkpoint import save_scalar_model
from rlhf_core.models.loader import load_tokenizer, new_scalar_model
from rlhf_core.train.reward import train_reward_model
from tasks.common import read_jsonl
from tasks.config import PipelineConfig
from tasks.stages.context import Stage, StageContext
from tasks.stages.records import DataRecord, ModelRecord
from tasks.stages.run import run_stage
from tasks.tracking.runs import RunContext


def body(sc: StageContext, data: DataRecord, init_dir: str) -> ModelRecord:
    """A fresh head on ``init_dir`` (the SFT policy), trained on ``judge_preference.jsonl``."""
    cfg, device, spec = sc.cfg, sc.device, sc.spec
    generator = sc.seeded()
    tokenizer = load_tokenizer(sc.local(data.tokenizer, "validate's tokenizer"), spec)
    rows = read_jsonl(sc.local(data.data, "the judge split") / "judge_preference.jsonl")
    model = new_scalar_model(init_dir, spec)
    epochs = cfg.retrain.gate.judge_epochs or cfg.reward.epochs
    reward = cfg.reward.model_copy(update={"epochs": epochs})
    train_reward_model(model, tokenizer, rows, reward, device, generator, on_log=sc.log,
                       progress=False, precision=spec.precision)
    out_dir = save_scalar_model(model, sc.dir / "model")
    return ModelRecord(model=sc.publish(out_dir, "checkpoint"),
                       metrics={"judge/pairs": float(len(rows))})


STAGE = Stage("judge_model", body, ModelRecord, seed_offset=7)


@task(name="judge_model")
def judge_model(ctx: RunContext, cfg: PipelineConfig, data: DataRecord,
                init_dir: str) -> ModelRecord:
    """Train the gate's judge reward model on the held-out pairs (fresh head on
    ``init_dir``, the SFT policy)."""
    return run_stage(ctx, cfg, STAGE, data=data, init_dir=init_dir)
