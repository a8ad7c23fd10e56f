"""`rlhf validate`: the data gate alone, tracked like a pipeline run (parent run + validate
child run with the GX results and Data Docs), nothing trained."""

from __future__ import annotations

from prefect import flow

from tasks.config.pipeline_config import PipelineConfig
from tasks.pipeline.finish import close_parent, fail_parent
from tasks.pipeline.prepare import pipeline_run_name, prepare
from tasks.pipeline.results import PipelineResult
from tasks.pipeline.stages.validate import validate
from tasks.platform.mlflow.runs import tag_parent
from tasks.platform.mlflow.tags import VALIDATE_ONLY_TAG
from tasks.platform.prefect.prefect_api import flow_run_name


def _flow_run_name() -> str:
    """The MLflow parent run's name to be, ``-validate`` added."""
    from prefect.runtime import flow_run

    cfg = flow_run.parameters.get("config")
    return f"{pipeline_run_name(cfg)}-validate" if isinstance(cfg, PipelineConfig) \
        else "rlhf-validate"


@flow(name="rlhf_validate", flow_run_name=_flow_run_name, log_prints=True)
def rlhf_validate(config: PipelineConfig) -> PipelineResult:
    prep = prepare(config, run_name=flow_run_name())
    ctx = prep.ctx
    tag_parent(ctx, {VALIDATE_ONLY_TAG: "true"})
    try:
        out = validate(ctx, config, prep)
    except BaseException:
        fail_parent(ctx)
        raise
    close_parent(ctx)
    return PipelineResult.of(ctx, {"validate": out})
