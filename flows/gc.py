"""The `gc` flow: `rlhf gc --yes` as the served deployment gc/<name> runs it on
``tracking.gc_schedule``. No ``from __future__ import annotations`` (Prefect reads the
signature's classes)."""

from prefect import flow

from flows.deployment import SERVED, served_config
from tasks.config.pipeline_config import PipelineConfig
from tasks.gc.plan import GcResult, collect_garbage


@flow(name="gc", flow_run_name="gc", log_prints=True)
def gc_flow(config: PipelineConfig = SERVED, delete: bool = True) -> GcResult:
    """Delete what no longer serves: older finished runs' folders, runs marked deleted in
    MLflow, old consumed and quarantined batches, fully pulled collections' records; never
    what a registry alias or a resumable run needs, nor an unconsumed batch.

    Args:
        config: The served pipeline config (tracking, retrain.watch_dir, collect.out_dir).
        delete: False: a dry run that lists, in the flow run's log, what would go.
    """
    return collect_garbage(served_config(config), delete)
