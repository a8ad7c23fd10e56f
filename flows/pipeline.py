"""The RLHF pipeline flow: wiring only (SPEC stages 1-8, each one task and one child run)."""

from __future__ import annotations

from prefect import flow

from flows.stages import rl_stages, shared_stages
from tasks.config import PipelineConfig
from tasks.evaluate import register
from tasks.finish import fail_parent, finish
from tasks.prepare import prepare
from tasks.tracking import RunContext, system_metrics


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
            outputs = shared_stages(ctx, config, prep)
            outputs.update(rl_stages(ctx, config, prep, outputs))
            outputs["register"] = register(ctx, config, outputs["ppo"], outputs["evaluate"],
                                           outputs["reward_model"], outputs["validate"])
    except BaseException:
        fail_parent(ctx)
        raise
    return finish(ctx, outputs)
