"""critic_init: the value model starts as a copy of the reward model when it is a source of
PPO's reward, else as a new scalar head on the start policy's trunk (with ``model.lora``, that
model's own folder, which PPO adapts); a critic-free estimator has none, and the run says so."""

from __future__ import annotations

from rlhf_core.models.loader import load_pretrained
from tasks.pipeline.stages.context import Stage, StageContext
from tasks.pipeline.stages.records import ModelRecord
from tasks.pipeline.stages.run import stage_task
from tasks.platform.mlflow.tags import CRITIC_SKIPPED_TAG, CRITIC_SOURCE_TAG

FROM_RM = "the reward model (trunk and head): it is among ppo.reward_sources"
FROM_POLICY = "the start policy's trunk with a new head: no reward model among ppo.reward_sources"
LORA = " (LoRA: PPO adds the critic's own adapter; nothing copied)"


def body(sc: StageContext, rm: ModelRecord, start: ModelRecord) -> ModelRecord:
    if not sc.cfg.ppo.uses_critic:
        reason = (f"no critic: ppo.advantage_estimator={sc.cfg.ppo.advantage_estimator} "
                  "uses no value model")
        sc.set_tags({CRITIC_SKIPPED_TAG: reason})
        return ModelRecord(figures={"critic": reason})
    fresh = sc.cfg.ppo.reward_model_source is None  # the RM's head: a score PPO never reads
    src = start if fresh else rm
    src_dir = sc.local(src.model, "the start policy" if fresh else "reward_model's model")
    source = src.model.uri or str(src_dir)
    sc.set_tags({CRITIC_SOURCE_TAG: source})
    said = FROM_POLICY if fresh else FROM_RM
    if sc.spec.lora is not None:  # PPO adapts the source's own folder: no copy
        return ModelRecord(model=src.model, source=source, fresh_head=fresh,
                           figures={"critic": said + LORA})
    if fresh:
        sc.seeded()  # the new head's draw
    model = load_pretrained(src_dir, sc.spec, "new_head") if fresh else \
        load_pretrained(src_dir, sc.spec, "scalar")  # float32: an exact copy
    out_dir = model.save(sc.dir / "model")
    metrics = {"critic/num_params": float(sum(p.numel() for p in model.parameters()))}
    sc.log(0, metrics)
    return ModelRecord(model=sc.publish(out_dir, "checkpoint"), source=source, metrics=metrics,
                       fresh_head=fresh, figures={"critic": said})


STAGE = Stage("critic_init", body, ModelRecord, seed_offset=5, metrics=("critic/num_params",),
              artifacts=("checkpoint",))
critic_init = stage_task(STAGE)
