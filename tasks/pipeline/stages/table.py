"""The one table of stages: each stage module's ``STAGE`` entry, in pipeline order. The
config's copy of the routable names (tasks/config/sections.py ROUTABLE) is tested equal to
``DISTRIBUTED``: the config cannot import the bodies."""

from __future__ import annotations

from tasks.pipeline.stages import (
    critic_init,
    evaluate,
    judge_model,
    ppo,
    register,
    reward_model,
    reward_norm,
    sft,
    validate,
)
from tasks.pipeline.stages.context import Stage

STAGES: dict[str, Stage] = {m.STAGE.name: m.STAGE for m in (
    validate, sft, reward_model, reward_norm, judge_model, critic_init, ppo, evaluate,
    register)}

# stages that run on torchrun ranks and can be routed to another machine's worker
DISTRIBUTED = tuple(name for name, stage in STAGES.items() if stage.ranks)
