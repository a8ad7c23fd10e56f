"""critic_init: the value model starts as a copy of the reward model (with ``model.lora``, its
own folder, which PPO adapts); a critic-free estimator has none, and the run says so."""

from __future__ import annotations

from rlhf_core.models.checkpoint import save_scalar_model
from rlhf_core.models.loader import load_scalar_model
from tasks.pipeline.stages.context import Stage, StageContext
from tasks.pipeline.stages.records import ModelRecord
from tasks.pipeline.stages.run import stage_task
from tasks.platform.mlflow.tags import CRITIC_SKIPPED_TAG, CRITIC_SOURCE_TAG


def body(sc: StageContext, rm: ModelRecord) -> ModelRecord:
    if not sc.cfg.ppo.uses_critic:
        reason = (f"no critic: ppo.advantage_estimator={sc.cfg.ppo.advantage_estimator} "
                  "uses no value model")
        sc.set_tags({CRITIC_SKIPPED_TAG: reason})
        return ModelRecord(figures={"critic": reason})
    rm_dir = sc.local(rm.model, "reward_model's model")
    source = rm.model.uri or str(rm_dir)
    if sc.spec.lora is not None:  # PPO adapts the reward model's own folder: no copy
        sc.set_tags({CRITIC_SOURCE_TAG: source})
        return ModelRecord(model=rm.model, source=source,
                           figures={"critic": "the reward model's adapter and head (LoRA: "
                                    "PPO adds the critic's own adapter; nothing copied)"})
    model = load_scalar_model(rm_dir, sc.spec)  # float32: an exact copy
    out_dir = save_scalar_model(model, sc.dir / "model")
    sc.set_tags({CRITIC_SOURCE_TAG: source})
    metrics = {"critic/num_params": float(sum(p.numel() for p in model.parameters()))}
    sc.log(0, metrics)
    return ModelRecord(model=sc.publish(out_dir, "checkpoint"), source=source, metrics=metrics)


STAGE = Stage("critic_init", body, ModelRecord, metrics=("critic/num_params",),
              artifacts=("checkpoint",))

critic_init = stage_task(STAGE)
