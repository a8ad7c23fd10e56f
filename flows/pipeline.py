"""The RLHF pipeline flow: wiring only (the stages of the stage table,
tasks/pipeline/stages/table.py, in its order; each one task and one child run). And the flow of
`rlhf validate`: the data gate alone, tracked like a pipeline run (parent run + validate child
run with the GX results and Data Docs), nothing trained.

No ``from __future__ import annotations`` (Prefect reads the signature's classes).
"""

from prefect import flow
from prefect.runtime import flow_run

from flows.wiring import run_pipeline
from tasks.config.pipeline_config import PipelineConfig
from tasks.pipeline.finish import close_finished, fail_parent
from tasks.pipeline.prepare import pipeline_run_name, prepare
from tasks.pipeline.results import PipelineResult
from tasks.pipeline.stages.validate import validate
from tasks.platform.mlflow.runs import tag_parent
from tasks.platform.mlflow.tags import VALIDATE_ONLY_TAG
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
    try:
        out = validate(ctx, config, prep)
    except BaseException:
        fail_parent(ctx)
        raise
    close_finished(ctx, keep_resume_state=True)  # nothing trained, nothing to resume
    return PipelineResult.of(ctx, {"validate": out})
