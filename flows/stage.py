"""The ``rlhf-stage`` flow: one stage (or one node of a multi-node stage) on this machine,
for a pipeline whose flow run is on another (tasks/platform/prefect/remote.py has the head's side).

Serve it (`rlhf stage-worker`) on each machine that should take stages, then route stages to it
(``routing.stages``) or use it for the other nodes of ``model.nnodes`` (``routing.nodes``).
"""

from prefect import flow
from prefect.runtime import flow_run
from prefect.settings import PREFECT_API_URL
from prefect.types.entrypoint import EntrypointType

from tasks.config.pipeline_config import ConfigError, PipelineConfig
from tasks.pipeline.prepare import setup_torch
from tasks.pipeline.stages.records import StageRecord
from tasks.pipeline.stages.run import execute, typed_inputs
from tasks.pipeline.stages.table import DISTRIBUTED, STAGES
from tasks.platform.mlflow.runs import RunContext, hardware_tags, set_tags
from tasks.platform.prefect.remote import local_context, record_routed, run_node


def _run_name() -> str:
    params = flow_run.parameters
    node = params.get("node")
    return f"{params['stage']}-node{node['rank']}" if node else str(params["stage"])


@flow(name="rlhf-stage", flow_run_name=_run_name, log_prints=True)
def rlhf_stage(stage: str, spec: dict, node: dict | None = None) -> StageRecord | None:
    """Run one pipeline stage (or one node of it) on this machine.

    Args:
        stage: The stage: sft, reward_model or ppo.
        spec: Written by the pipeline's run: its MLflow child run, run context, config and
            the stage's inputs (MLflow artifact URIs beside local paths).
        node: For a multi-node stage, this node's rank and the head's rendezvous address.
    """
    if stage not in DISTRIBUTED:
        raise ValueError(f"rlhf-stage runs {', '.join(DISTRIBUTED)}, not {stage!r}")
    ctx = local_context(RunContext.model_validate(spec["ctx"]))
    if node is not None:
        run_node(ctx, spec, node)
        return None
    cfg = PipelineConfig.model_validate(spec["cfg"])
    here = {k: v for k, v in cfg.routing.stages.items() if k != stage}  # run it, don't route
    cfg = cfg.model_copy(update={"routing": cfg.routing.model_copy(update={"stages": here})})
    # this machine ran it: its hardware over the head's on the child run
    set_tags(ctx.client(), spec["run_id"], hardware_tags(setup_torch(cfg.model)))
    entry = STAGES[stage]
    out = execute(ctx, cfg, entry, spec["run_id"], typed_inputs(entry, spec["inputs"]))
    record_routed(ctx, spec["run_id"], out.model_dump(mode="json"))
    return out


def stage_deployment(name: str):
    return rlhf_stage.to_deployment(
        name=name, tags=["rlhf"], entrypoint_type=EntrypointType.MODULE_PATH,
        description="One RLHF pipeline stage (or one node of it) on this machine, for a "
                    "pipeline run elsewhere; see routing.stages and model.nnodes.")


def serve_stage(name: str) -> None:
    """Serve ``rlhf-stage/<name>`` from this machine until interrupted (blocks), again after
    the Prefect server comes back from an outage (tasks/platform/prefect/reconnect.py)."""
    from tasks.platform.prefect.reconnect import serve_until_stopped

    if not PREFECT_API_URL.value():
        raise ConfigError("rlhf stage-worker needs the pipeline's Prefect server: export "
                          "PREFECT_API_URL=http://<prefect-host>:4200/api")
    serve_until_stopped(lambda: [stage_deployment(name)], f"rlhf-stage/{name}")
