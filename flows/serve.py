"""`rlhf serve`: the flows of SERVED_FLOWS as Prefect deployments, served from one long-running
process (``prefect.serve``; no Docker, no worker). The pipeline deployment's parameters are the
typed config sections, so the UI's "Custom run" form shows every field; a run merges the fields
it sets onto the served config. No ``from __future__ import annotations``: Prefect builds the
parameter model from the signature's classes."""

import json
from datetime import timedelta
from typing import Annotated, Any

from prefect import flow
from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
from prefect.events import DeploymentEventTrigger
from prefect.runtime import flow_run
from prefect.schedules import Cron, Interval
from prefect.settings import PREFECT_API_URL
from prefect.types.entrypoint import EntrypointType
from pydantic import BeforeValidator

from data_checks.config import DataConfig, ValidationConfig, blank_data
from flows.wiring import run_pipeline
from rlhf_core.config import (
    EvalConfig,
    ModelConfig,
    PPOConfig,
    RewardConfig,
    RewardNormConfig,
    SFTConfig,
)
from tasks.config.form import Form
from tasks.config.pipeline_config import ConfigError, PipelineConfig, _merge, flatten
from tasks.config.sections import DemoConfig, RoutingConfig, TrackingConfig
from tasks.pipeline.prepare import pipeline_run_name
from tasks.pipeline.results import PipelineResult
from tasks.platform.prefect.events import LABELLED
from tasks.platform.prefect.logins import login_out_of_uri
from tasks.platform.prefect.prefect_api import deployment_parameters, ensure_limit, flow_run_name
from tasks.platform.redact import redact, redacted
from tasks.retrain.approval.waiting import keeper
from tasks.retrain.round import limit_name

# what `rlhf serve` serves, in the order it registers them (each as <flow>/<name>)
SERVED_FLOWS = ("rlhf_pipeline", "retrain", "collect", "label-pull", "gc")
# the served pipeline's parameters; retrain and collect belong to their own flows
SECTIONS = tuple(name for name in PipelineConfig.model_fields if name not in ("retrain", "collect"))

# the form's data section: its sources' fields (every path left empty: the demo's data)
FormData = Annotated[DataConfig | None, BeforeValidator(lambda v: None if blank_data(v) else v),
                     Form()]


def served_parameters(config: PipelineConfig) -> dict[str, Any]:
    """The deployment's stored parameter values: the served config, section by section."""
    dump = config.form_dump()
    return {name: dump[name] for name in SECTIONS}


def resolve_config(given: dict[str, Any]) -> tuple[PipelineConfig, dict]:
    """served config <- the fields a run set -> (config, {dotted key: new value} changed)."""
    served = deployment_parameters() or served_parameters(PipelineConfig())
    # only the fields a run set in a section: the others keep their served values
    fields = {name: value.model_dump(mode="json", exclude_unset=True)
              if hasattr(value, "model_dump") else value for name, value in given.items()}
    config = PipelineConfig.model_validate(_merge(served, fields))
    before = flatten(PipelineConfig.model_validate(served).model_dump(mode="json"))
    after = flatten(config.model_dump(mode="json"))
    changed = {k: v for k, v in after.items() if before.get(k) != v}
    return config, changed


def run_label(changed: dict[str, Any], limit: int = 3) -> str:
    """What a run changed, for its name: ``kl_coef=0.07 lr=1e-05 +2`` (URL passwords as ``***``)."""
    parts = [f"{key.rsplit('.', 1)[-1]}={redact(str(value))}"
             for key, value in list(changed.items())[:limit]]
    if len(changed) > limit:
        parts.append(f"+{len(changed) - limit}")
    return " ".join(parts)


def _served_run_name() -> str:
    """A CLI run's name plus what the form changed (``... kl_coef=0.07``), so runs tell apart
    in the Runs list; the MLflow parent run takes the same name."""
    given = {k: v for k, v in flow_run.parameters.items() if k in SECTIONS}
    try:
        config, changed = resolve_config(given)
    except Exception:  # an invalid form: the flow itself reports it
        return "rlhf-pipeline"
    return pipeline_run_name(config, run_label(changed))


@flow(name="rlhf_pipeline", flow_run_name=_served_run_name, log_prints=True)
def rlhf_pipeline_served(
    seed: int = 0,
    demo: Annotated[DemoConfig, Form()] = DemoConfig(),
    data: FormData = None,
    model: Annotated[ModelConfig, Form()] = ModelConfig(),
    validation: Annotated[ValidationConfig, Form()] = ValidationConfig(),
    sft: Annotated[SFTConfig, Form()] = SFTConfig(),
    reward: Annotated[RewardConfig, Form()] = RewardConfig(),
    reward_norm: Annotated[RewardNormConfig, Form()] = RewardNormConfig(),
    ppo: Annotated[PPOConfig, Form()] = PPOConfig(),
    eval: Annotated[EvalConfig, Form()] = EvalConfig(),
    tracking: Annotated[TrackingConfig, Form()] = TrackingConfig(),
    routing: Annotated[RoutingConfig, Form()] = RoutingConfig(),
    resume_run_id: str = "",
) -> PipelineResult:
    """The whole RLHF pipeline with the served config; fields you change override it.

    Args:
        seed: Seed for every stage (data order, init, sampling).
        demo: The embedded demo: synthetic data with a gold judge and a tiny GPT-2.
        data: Data sources; every path left empty runs on the demo's data. For yours, give
            sft, preference and prompts each a path (a JSONL/CSV/Parquet file, a folder or a
            dataset id), optionally eval_prompts and preference_eval too.
        model: Base model and where to train it.
        validation: The data gate: token budgets and allowed truncated/dropped shares.
        sft: Supervised fine-tuning on the demonstrations.
        reward: Reward-model training on the preference pairs.
        reward_norm: Reward normalisation on the SFT set.
        ppo: PPO: rollouts, KL penalty, GAE, clipped losses.
        eval: Held-out evaluation of SFT vs PPO.
        tracking: MLflow experiment, registry names, checkpoints.
        routing: Stages on other machines' workers (rlhf-stage deployments).
        resume_run_id: Continue this MLflow parent run (its id, as `rlhf runs` lists it):
            finished stages are skipped. Empty: a new run.
    """
    given = {name: value for name, value in locals().items() if name in SECTIONS}
    config, changed = resolve_config(given)
    config = login_out_of_uri(config)  # a login typed into the form: out of the records
    if changed:
        print(overrides_line(changed))
    return run_pipeline(config, resume_run_id or None, run_name=flow_run_name())


def overrides_line(changed: dict[str, Any]) -> str:
    """What a run changed of the served config, for its log (passwords in URLs hidden)."""
    return f"overrides of the served config: {json.dumps(redacted(changed))}"


def as_schedules(s) -> list | None:
    """A ScheduleConfig as Prefect schedules (None: manual runs only)."""
    if s is None:
        return None
    if s.cron is not None:
        return [Cron(s.cron, timezone=s.timezone)]
    return [Interval(timedelta(seconds=s.interval_s))]


def labels_trigger():
    """A retrain starts when labels are imported (`rlhf label import`, `rlhf demo-batch`);
    a retrain's own imports start no other."""
    return DeploymentEventTrigger(
        name="labels imported", expect={LABELLED},
        match={"prefect.resource.id": "rlhf.preferences.*", "rlhf.imported_by": "import"})


def _deployment(flow, name: str, parameters: dict, description: str, schedule=None, **more):
    return flow.to_deployment(name=name, parameters=parameters, tags=["rlhf"],
                              schedules=as_schedules(schedule), description=description,
                              entrypoint_type=EntrypointType.MODULE_PATH, **more)


def gc_deployment(config: PipelineConfig, name: str):
    """`rlhf gc --yes` on ``tracking.gc_schedule`` (manual runs when None)."""
    from flows.gc import gc_flow

    return _deployment(gc_flow, name, {"config": config.form_dump()},
                       "Delete what no longer serves (older finished runs' folders, runs "
                       "deleted in MLflow, old batches, pull records); never an alias's or a "
                       "resumable run's.", config.tracking.gc_schedule)


def served_deployments(config: PipelineConfig, name: str) -> list:
    """The deployments `rlhf serve` serves, in SERVED_FLOWS' order."""
    from flows.collect import collect_flow, label_pull
    from flows.retrain import retrain

    given, dest = {"config": config.form_dump()}, config.collect.destination
    # one retrain at a time: a run that finds one running is cancelled before it starts
    # (skip) or queued (wait); the flow's own slot (flows/retrain.py) covers direct calls
    strategy = ConcurrencyLimitStrategy.CANCEL_NEW if config.retrain.on_overlap == "skip" \
        else ConcurrencyLimitStrategy.ENQUEUE
    return [
        _deployment(rlhf_pipeline_served, name, served_parameters(config),
                    "The whole RLHF pipeline. Custom run: change any field; the others keep "
                    "the served config."),
        _deployment(retrain, name, given, f"Retrain on new preference batches in "
                    f"{config.retrain.watch_dir}; champion moves only on a significant win.",
                    config.retrain.schedule, triggers=[labels_trigger()],
                    concurrency_limit=ConcurrencyLimitConfig(limit=1, collision_strategy=strategy)),
        _deployment(collect_flow, name, given, f"Sample {config.collect.policy} on fresh "
                    f"prompts into a labelling file in {config.collect.out_dir}.",
                    config.collect.schedule),
        # pulls on collect.destination.pull_schedule only when collections go to Label Studio
        _deployment(label_pull, name, given, "Finished Label Studio annotations of the "
                    "collections -> preference batches (each pair once); each batch starts a "
                    "retrain.", dest.pull_schedule if dest.kind == "label_studio" else None),
        gc_deployment(config, name)]


def serve(config: PipelineConfig, name: str) -> None:
    """Serve the deployments until interrupted (blocks), again after a Prefect server outage.
    Needs a Prefect server."""
    from tasks.platform.prefect.reconnect import serve_until_stopped

    if not PREFECT_API_URL.value():
        raise ConfigError("rlhf serve needs a Prefect server: run `prefect server start`, then "
                          "`export PREFECT_API_URL=http://127.0.0.1:4200/api`")
    ensure_limit(limit_name(config))
    with keeper(config):  # retrain.approval required: deadlines, answers left half done
        serve_until_stopped(lambda: served_deployments(config, name),
                            ", ".join(f"{flow}/{name}" for flow in SERVED_FLOWS))
