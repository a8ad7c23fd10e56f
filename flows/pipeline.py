"""The RLHF pipeline flow: wiring only (the stages of the stage table,
tasks/pipeline/stages/table.py, in its order; each one task and one child run).

No ``from __future__ import annotations`` (Prefect reads the signature's classes).
"""

from prefect import flow

from flows.wiring import run_pipeline
from tasks.config.pipeline_config import PipelineConfig
from tasks.pipeline.prepare import pipeline_run_name
from tasks.pipeline.results import PipelineResult
from tasks.platform.prefect.prefect_api import flow_run_name


def _flow_run_name() -> str:
    """The MLflow parent run's name to be (tasks/pipeline/prepare.py pipeline_run_name)."""
    from prefect.runtime import flow_run

    cfg = flow_run.parameters.get("config")
    if isinstance(cfg, PipelineConfig):
        return pipeline_run_name(cfg)
    return "rlhf"


@flow(name="rlhf_pipeline", flow_run_name=_flow_run_name, log_prints=True)
def rlhf_pipeline(config: PipelineConfig, resume_run_id: str | None = None) -> PipelineResult:
    """The whole pipeline, the stage table's stages in its order (flows/wiring.py), tracked in
    MLflow: one parent run, one child run per stage."""
    return run_pipeline(config, resume_run_id, run_name=flow_run_name())
