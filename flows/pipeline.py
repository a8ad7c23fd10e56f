"""The flows of `rlhf run`, `rlhf validate` and `rlhf sweep`, wiring only (flows/wiring.py holds
the stage order). validate runs the data gate alone, tracked like a pipeline run, nothing
trained. A sweep runs the stages before RL once, then each grid point x seed as a child flow run
with its own MLflow parent run (tagged with the sweep id); a failed point is recorded and the
others go on.

No ``from __future__ import annotations`` (Prefect reads the signature's classes).
"""

import time
from typing import Any

from prefect import flow, task
from prefect.runtime import flow_run

from flows.wiring import failing, rl_stages, run_pipeline, shared_stages
from tasks.config.pipeline_config import PipelineConfig, grid_points
from tasks.pipeline.finish import close_finished, finish
from tasks.pipeline.prepare import Prepared, pipeline_run_name, prepare
from tasks.pipeline.results import PipelineResult, SweepResult
from tasks.pipeline.stages.records import SharedStages
from tasks.pipeline.stages.validate import validate
from tasks.pipeline.sweep import open_point_run, point_label, point_row, sweep_summary
from tasks.platform.mlflow.runs import tag_parent
from tasks.platform.mlflow.tags import (
    SWEEP_POINTS_TAG,
    SWEEP_ROLE_TAG,
    SWEEP_TAG,
    VALIDATE_ONLY_TAG,
)
from tasks.platform.prefect.prefect_api import flow_run_name


def _flow_run_name(suffix: str = "") -> str:
    """The parent run's name to be (tasks/pipeline/prepare.py pipeline_run_name) + ``suffix``."""
    cfg = flow_run.parameters.get("config")
    return (pipeline_run_name(cfg) if isinstance(cfg, PipelineConfig) else "rlhf") + suffix


@flow(name="rlhf_pipeline", flow_run_name=_flow_run_name, log_prints=True)
def rlhf_pipeline(config: PipelineConfig, resume_run_id: str | None = None) -> PipelineResult:
    """The whole pipeline, the stage table's stages in its order (flows/wiring.py), tracked in
    MLflow: one parent run, one child run per stage."""
    return run_pipeline(config, resume_run_id, run_name=flow_run_name())


@flow(name="rlhf_validate", flow_run_name=lambda: _flow_run_name("-validate"), log_prints=True)
def rlhf_validate(config: PipelineConfig) -> PipelineResult:
    prep = prepare(config, run_name=flow_run_name())
    ctx = prep.ctx
    tag_parent(ctx, {VALIDATE_ONLY_TAG: "true"})
    with failing(ctx):
        out = validate(ctx, config, prep)
    close_finished(ctx, keep_resume_state=True)  # nothing trained, nothing to resume
    return PipelineResult.of(ctx, {"validate": out})


def _point_name() -> str:
    params = flow_run.parameters
    return f"{params.get('sweep_id', 'sweep')}-{point_label(params.get('overrides', {}))}"


@flow(name="rlhf_sweep_point", flow_run_name=_point_name, log_prints=True)
def sweep_point(config: PipelineConfig, overrides: dict[str, Any], sweep_id: str,
                shared: SharedStages, base_prep: Prepared) -> PipelineResult:
    """critic_init -> ppo -> evaluate for one point, in its own MLflow parent run."""
    prep = open_point_run(config, base_prep, sweep_id, overrides)
    ctx = prep.ctx
    with failing(ctx):
        outputs = rl_stages(ctx, config, prep, shared.outputs())
    return finish(ctx, outputs, config.tracking.keep_resume_state)


@task(name="sweep_point")
def run_point(config: PipelineConfig, overrides: dict[str, Any], sweep_id: str,
              shared: SharedStages, base_prep: Prepared) -> PipelineResult:
    """The point's child flow run, inside a task so points can run side by side."""
    return sweep_point(config, overrides, sweep_id, shared, base_prep)


@flow(name="rlhf_sweep", log_prints=True,
      flow_run_name=lambda: str(flow_run.parameters.get("sweep_id") or "rlhf-sweep"))
def rlhf_sweep(config: PipelineConfig, grid: dict[str, list[Any]], seeds: list[int] | None = None,
               sweep_id: str | None = None, max_concurrent: int = 1) -> SweepResult:
    """Shared stages once, then every grid point x seed (``max_concurrent`` at a time), then
    the summary. ``grid``: {'ppo.kl_coef': [0.02, 0.05], ...}; ``seeds``: default [config.seed].
    """
    points = grid_points(config, grid, seeds or [config.seed])
    sweep_id = sweep_id or f"sweep-{time.strftime('%Y%m%d-%H%M%S')}"
    shared_cfg = config.model_copy(update={"tracking": config.tracking.model_copy(
        update={"run_name": f"{sweep_id}-shared"})})
    base_prep = prepare(shared_cfg)
    ctx = base_prep.ctx
    tag_parent(ctx, {SWEEP_TAG: sweep_id, SWEEP_ROLE_TAG: "shared", SWEEP_POINTS_TAG: len(points)})
    with failing(ctx):
        shared = SharedStages.model_validate(shared_stages(ctx, shared_cfg, base_prep))
    rows = []
    for start in range(0, len(points), max(1, max_concurrent)):
        wave = points[start: start + max(1, max_concurrent)]
        futures = [run_point.submit(cfg, overrides, sweep_id, shared, base_prep)
                   for overrides, cfg in wave]
        for (overrides, _), future in zip(wave, futures):
            future.wait()
            state = future.state
            if state.is_completed():
                rows.append(point_row(overrides, future.result(), None))
            else:
                rows.append(point_row(overrides, None, state.message or state.name))
    summary = sweep_summary(ctx, rows)
    close_finished(ctx, config.tracking.keep_resume_state)
    return SweepResult(sweep_id=sweep_id, parent_run_id=ctx.parent_run_id,
                       experiment_id=ctx.experiment_id, tracking_uri=ctx.tracking_uri, **summary)
