"""The RLHF pipeline flow: wiring only (SPEC stages 1-8, each one task and one child run)."""

from __future__ import annotations

from prefect import flow

from tasks.config import PipelineConfig
from tasks.evaluate import evaluate, register
from tasks.finish import fail_parent, finish
from tasks.ppo import ppo
from tasks.prepare import prepare
from tasks.tracking import RunContext, system_metrics
from tasks.train import critic_init, reward_model, reward_norm, sft
from tasks.validate import validate


def _flow_run_name() -> str:
    from prefect.runtime import flow_run

    cfg = flow_run.parameters.get("config")
    if isinstance(cfg, PipelineConfig):
        return f"rlhf-{cfg.short_name()}"
    return "rlhf"


@flow(name="rlhf_pipeline", flow_run_name=_flow_run_name, log_prints=True)
def rlhf_pipeline(config: PipelineConfig, resume_run_id: str | None = None) -> dict:
    """validate -> sft -> reward_model -> reward_norm -> critic_init -> ppo -> evaluate ->
    register, tracked in MLflow (one parent run, one child run per stage)."""
    prep = prepare(config, resume_run_id)
    ctx = RunContext.model_validate(prep["ctx"])
    tracking = config.tracking
    try:
        with system_metrics(ctx, tracking.system_metrics, tracking.system_metrics_interval_s):
            data = validate(ctx, config, prep)
            sft_out = sft(ctx, config, prep, data)
            rm_out = reward_model(ctx, config, prep, data, sft_out)
            norm_out = reward_norm(ctx, config, data, rm_out)
            critic_out = critic_init(ctx, config, rm_out)
            ppo_out = ppo(ctx, config, prep, data, sft_out, rm_out, norm_out, critic_out)
            eval_out = evaluate(ctx, config, prep, data, sft_out, rm_out, ppo_out)
            reg_out = register(ctx, config, ppo_out, eval_out, rm_out, data)
    except BaseException:
        fail_parent(ctx)
        raise
    outputs = {"validate": data, "sft": sft_out, "reward_model": rm_out,
               "reward_norm": norm_out, "critic_init": critic_out, "ppo": ppo_out,
               "evaluate": eval_out, "register": reg_out}
    return finish(ctx, outputs)
