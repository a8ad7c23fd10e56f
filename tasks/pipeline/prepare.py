"""Pipeline set-up: the MLflow parent run (new or resumed), params and tags, demo assets; and
a stage's torch set-up from the ``model:`` section (threads, device, the load spec)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from prefect import task
from pydantic import BaseModel, ConfigDict

from data_checks.config import DataConfig, DataSource
from rlhf_core.config import ModelConfig
from rlhf_core.models.sources import cached_digest, resolve_model_source
from tasks.config.pipeline_config import PipelineConfig
from tasks.pipeline.identity import RunIdentity
from tasks.pipeline.judge import config_judge_name
from tasks.pipeline.rewards import check_reward_sources
from tasks.platform.files import read_json, write_json
from tasks.platform.mlflow.addresses import default_tracking_uri
from tasks.platform.mlflow.runs import (
    RunContext,
    create_parent_run,
    end_run,
    ensure_experiment,
    ensure_store,
    hardware_tags,
    parent_runs,
    reopen_run,
    run_to_resume,
    set_tags,
    tracking_client,
)
from tasks.platform.mlflow.tags import PRECISION_TAG, PREFECT_FLOW_RUN_TAG, RUN_NAME_TAG
from tasks.platform.prefect.remote import check_deployments

if TYPE_CHECKING:  # torch and the model code load with the first model, not this module
    import torch

    from rlhf_core.models.loader import LoadSpec


def setup_torch(model_cfg: ModelConfig) -> torch.device:
    import torch

    from rlhf_core.models.models import resolve_device

    if model_cfg.torch_threads:
        torch.set_num_threads(model_cfg.torch_threads)
    return resolve_device(model_cfg.device)


def setup_models(model_cfg: ModelConfig) -> tuple[torch.device, LoadSpec]:
    """The device and the one load spec every model and tokenizer load of a stage uses."""
    from rlhf_core.models.loader import LoadSpec

    device = setup_torch(model_cfg)
    return device, LoadSpec.from_config(model_cfg, device)


class Prepared(BaseModel):
    """What ``prepare`` resolved before any stage; a retrain adds its batches."""

    model_config = ConfigDict(frozen=True)
    ctx: RunContext
    data: DataConfig
    base_model: str
    tokenizer: str
    judge: str
    # model.base_model as given (and a GGUF file's digest), for adapters to name; None: demo
    base_source: dict[str, str] | None = None
    # a retrain's batches: rows per batch, digests, sources
    batch_rows: list[dict] = []
    trained_on: list[str] = []
    batch_sources: dict[str, str] = {}


def default_run_name(cfg: PipelineConfig) -> str:
    """Start time first, so runs differ within the first characters a runs table shows."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{cfg.short_name()}"


def pipeline_run_name(cfg: PipelineConfig, changes: str = "") -> str:
    """A new run's one label everywhere: ``tracking.run_name``, else the default name plus
    what a served run's form changed (``changes``, e.g. ``kl_coef=0.07``)."""
    return cfg.tracking.run_name or " ".join(filter(None, [default_run_name(cfg), changes]))


def _prefect_flow_run_id() -> str | None:
    try:
        from prefect.runtime import flow_run

        return flow_run.id
    except Exception:  # noqa: BLE001 - not inside a flow run
        return None


def _resumable(client, exp_id: str, identity: RunIdentity):
    """The parent run to continue: the same Prefect flow run, else the same run name with
    unchanged inputs (a changed one is never continued: a new run starts, saying why)."""
    if identity.flow_run_id:
        found = parent_runs(client, exp_id, PREFECT_FLOW_RUN_TAG, identity.flow_run_id)
        if found:
            return found[0].info.run_id
    name = identity.cfg.tracking.run_name
    if not name:
        return None
    same_name = parent_runs(client, exp_id, RUN_NAME_TAG, name)
    for run in same_name:
        if not identity.changes(run.data.tags):
            return run.info.run_id
    if same_name:
        changes = identity.changes(same_name[0].data.tags)
        print(f"rlhf: run name '{name}' (run {same_name[0].info.run_id}) was made from other "
              f"inputs, changed: {'; '.join(changes)}. Starting a new run; its finished "
              "stages are not reused.", file=sys.stderr)
    return None


def open_parent_run(cfg: PipelineConfig, resume_run_id: str | None,
                    run_name: str | None = None) -> RunContext:
    """Create the parent run, or reopen it (``resume_run_id``, or same run name + inputs);
    a reopened run keeps its name."""
    uri = default_tracking_uri(cfg.tracking.tracking_uri)
    ensure_store(uri)
    client = tracking_client(uri)
    exp_id = ensure_experiment(client, cfg.tracking.experiment, uri)
    identity = RunIdentity.of(cfg, cfg.tracking.run_name or run_name or default_run_name(cfg),
                              _prefect_flow_run_id())
    run_id = resume_run_id or _resumable(client, exp_id, identity)
    if run_id is not None:
        run = run_to_resume(client, run_id)
        identity.check_resume(run)
        exp_id, run_name = run.info.experiment_id, run.info.run_name or identity.run_name
        reopen_run(client, run, identity.config, identity.config_hash)
    else:
        run_name = identity.run_name
        run_id = create_parent_run(client, exp_id, run_name, identity.new_run_tags(),
                                   identity.config)
    # the stages' thread count from here on, so each run's rlhf.hw.threads is the one used
    from rlhf_core.models.precision import choose_precision

    device = setup_torch(cfg.model)
    precision, why = choose_precision(cfg.model.precision, device, bool(cfg.model.base_model))
    print(f"precision: {precision} ({why})", flush=True)
    set_tags(client, run_id, {**hardware_tags(device),  # a resume records where it continues
                              PRECISION_TAG: f"{precision} ({why})"})
    workdir = Path(cfg.tracking.workdir).resolve() / run_id
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError:
        end_run(client, run_id, "FAILED")
        raise
    return RunContext(tracking_uri=uri, experiment_id=exp_id, parent_run_id=run_id, seed=cfg.seed,
                      workdir=str(workdir), progress=cfg.tracking.progress, device=device.type,
                      outage_limit_s=cfg.tracking.outage_limit_s, run_name=run_name)


def demo_assets(cfg: PipelineConfig, workdir: Path) -> dict[str, str]:
    """The demo data under workdir/demo (made once), with a tiny base model unless
    ``model.base_model`` is set."""
    from rlhf_core.demo import build_demo_assets

    root = workdir / "demo"
    marker = root / "assets.json"
    if marker.exists():
        return read_json(marker)
    d = cfg.demo
    paths = build_demo_assets(root, seed=cfg.seed, sizes=d.sizes(), chat=d.chat, system=d.system,
                              rm_length_bias=d.rm_length_bias, with_model=not cfg.model.base_model,
                              n_layer=d.n_layer, n_embd=d.n_embd, n_head=d.n_head)
    out = {k: str(v) for k, v in paths.items()}
    write_json(marker, out)
    return out


def base_identity(cfg: PipelineConfig) -> str:
    """The base model a run trains from, as its registered versions record it."""
    return cfg.model.base_model or "the embedded demo's tiny GPT-2"


def check_registry_base(cfg: PipelineConfig) -> None:
    """Refuse, before training, a registered model whose versions came from another base."""
    if not cfg.tracking.register_models:
        return
    from tasks.platform.mlflow.errors import RegistryError
    from tasks.platform.mlflow.registry import registered_base

    name, uri = cfg.tracking.registered_policy, default_tracking_uri(cfg.tracking.tracking_uri)
    ensure_store(uri)  # a new SQLite store is migrated once, under its lock
    found = registered_base(uri, name)
    if found is not None and found[1] != base_identity(cfg):
        raise RegistryError(
            f"tracking.registered_policy={name}: its versions (v{found[0]}) were trained from "
            f"{found[1]}, this run trains from {base_identity(cfg)}; one registered model holds "
            "one base model's policies (set tracking.registered_policy, and "
            "tracking.registered_reward_model, to names of this model's own)")


def check_registered_scorer(cfg: PipelineConfig) -> None:
    """Check that ``ppo.health.scorer``'s registered model exists, before training."""
    uri = cfg.ppo.health.external_scorer
    if uri is None:
        return
    from tasks.platform.mlflow.errors import RegistryError
    from tasks.platform.mlflow.models import registered_alias_problem

    problem = registered_alias_problem(uri, default_tracking_uri(cfg.tracking.tracking_uri))
    if problem is not None:
        raise RegistryError(f"ppo.health.scorer={uri}: {problem}")


def check_outside_models(cfg: PipelineConfig) -> None:
    """Check what the run needs from outside it, before any training starts."""
    check_registered_scorer(cfg)
    check_reward_sources(cfg.ppo, default_tracking_uri(cfg.tracking.tracking_uri))
    check_registry_base(cfg)


@task(name="prepare")
def prepare(cfg: PipelineConfig, resume_run_id: str | None = None,
            run_name: str | None = None) -> Prepared:
    """Open the parent run and resolve the data sources and base model (the demo's when
    asked). A failure once the parent run exists marks it FAILED."""
    if cfg.data is None and not cfg.demo.enabled:
        raise ValueError("no data: set `data:` in the config (or demo.enabled: true)")
    if not cfg.model.base_model and not cfg.demo.enabled:
        raise ValueError("no base model: set model.base_model (or demo.enabled: true)")
    workdir = Path(cfg.tracking.workdir)
    if workdir.exists() and not workdir.is_dir():
        raise ValueError(f"tracking.workdir={workdir} is a file, not a folder")
    rates = cfg.from_scratch_rates()
    if rates:
        print(f"warning: {', '.join(rates)}: learning rates for a model trained from scratch, "
              f"on the pretrained base {cfg.model.base_model}; pretrained models fine-tune at "
              "about 1e-6 to 5e-5 in full and ten times that with model.lora "
              "(configs/smollm2.yaml)", flush=True)
    check_deployments(cfg)  # stages on other machines: their deployments exist
    check_outside_models(cfg)
    ctx = open_parent_run(cfg, resume_run_id, run_name)
    try:
        data, base_model = cfg.data, cfg.model.base_model
        if cfg.demo.enabled:
            assets = demo_assets(cfg, Path(ctx.workdir))
            base_model = base_model or assets["base_model"]
            if data is None:
                data = DataConfig(**{role: DataSource(path=assets[role])
                                     for role in DataConfig.model_fields if role in assets})
        # a GGUF file (or a package's) becomes its cached Hugging Face folder, made once
        base_model = resolve_model_source(base_model)
        tokenizer = resolve_model_source(cfg.model.tokenizer) if cfg.model.tokenizer else base_model
        named, source = None, cfg.model.base_model
        if source:
            digest = cached_digest(base_model)
            named = {"source": source, **({"sha256": digest} if digest else {})}
        return Prepared(ctx=ctx, data=data, base_model=base_model, tokenizer=tokenizer,
                        judge=config_judge_name(cfg), base_source=named)
    except BaseException:
        end_run(ctx.client(), ctx.parent_run_id, "FAILED")
        raise
