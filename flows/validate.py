"""`rlhf validate`: the data gate alone, tracked like a pipeline run (parent run + validate
child run with the GX results and Data Docs), nothing trained."""

from __future__ import annotations

from prefect import flow

from tasks.config import PipelineConfig
from tasks.finish import close_parent, fail_parent
from tasks.prepare import prepare
from tasks.results import PipelineResult
from tasks.stages.validate import validate
from tasks.tracking.runs import tag_parent
from tasks.tracking.tags import VALIDATE_ONLY_TAG


@flow(name="rlhf_validate", flow_run_name=lambda: "rlhf-validate", log_prints=True)
def rlhf_validate(config: PipelineConfig) -> PipelineResult:
    prep = prepare(config)
    ctx = prep.ctx
    tag_parent(ctx, {VALIDATE_ONLY_TAG: "true"})
    try:
        out = validate(ctx, config, prep)
    except BaseException:
        fail_parent(ctx)
        raise
    close_parent(ctx)
    return PipelineResult.of(ctx, {"validate": out})
