"""The pipeline's two halves as reusable wiring, composed by every flow that trains.

``shared_stages``: validate -> sft -> reward_model -> reward_norm (what a sweep over RL
settings computes once). ``rl_stages``: critic_init -> ppo -> evaluate (what each sweep point,
and the pipeline after the shared half, runs). Flows call these; none copies the order.
"""

from __future__ import annotations

from tasks.config import PipelineConfig
from tasks.evaluate import evaluate
from tasks.ppo import ppo
from tasks.tracking import RunContext
from tasks.train import critic_init, reward_model, reward_norm, sft
from tasks.validate import validate

SHARED = ("validate", "sft", "reward_model", "reward_norm")
RL = ("critic_init", "ppo", "evaluate")


def shared_stages(ctx: RunContext, config: PipelineConfig, prep: dict) -> dict[str, dict]:
    """Data gate, SFT, reward model and its normalisation -> {stage: output}."""
    data = validate(ctx, config, prep)
    sft_out = sft(ctx, config, prep, data)
    rm_out = reward_model(ctx, config, prep, data, sft_out)
    norm_out = reward_norm(ctx, config, data, rm_out)
    return {"validate": data, "sft": sft_out, "reward_model": rm_out, "reward_norm": norm_out}


def rl_stages(ctx: RunContext, config: PipelineConfig, prep: dict,
              shared: dict[str, dict]) -> dict[str, dict]:
    """Critic warm-start (or its skip), the RL stage and evaluation, on the shared outputs."""
    data, sft_out, rm_out = shared["validate"], shared["sft"], shared["reward_model"]
    critic_out = critic_init(ctx, config, rm_out)
    ppo_out = ppo(ctx, config, prep, data, sft_out, rm_out, shared["reward_norm"], critic_out)
    eval_out = evaluate(ctx, config, prep, data, sft_out, rm_out, ppo_out)
    return {"critic_init": critic_out, "ppo": ppo_out, "evaluate": eval_out}
