"""Running a stage: skip it when its finished child run recorded an output, else run the body
in a child run (here, on torchrun ranks or on a worker) and record its typed output. Each
stage's Prefect task is derived from its table entry here.

What Prefect draws as a task's upstream edges: its direct data dependencies only. Prefect
draws an edge from every task whose result a task is given, and stages are given more than they
directly use (prepare's result, records another input derives from), so each record remembers
what it was made from and inputs implied by another are passed in ``quote`` (no edge)."""

from __future__ import annotations

import inspect
import sys
import time
import typing
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import torch
from prefect import Task
from prefect.utilities.annotations import quote
from pydantic import BaseModel, TypeAdapter

from rlhf_core.faults import crash_point, pause_point
from rlhf_core.memory import trim_heap
from tasks.config.pipeline_config import PipelineConfig, flatten
from tasks.pipeline.prepare import Prepared
from tasks.pipeline.retention import owning
from tasks.pipeline.stages.context import Stage, StageContext, metric_logger
from tasks.pipeline.stages.records import StageRecord
from tasks.platform.mlflow.runs import (
    RunContext,
    completed_output,
    record_output,
    run_url,
    stage_run,
)
from tasks.platform.mlflow.spool import resend_left
from tasks.platform.prefect.prefect_api import in_prefect_run
from tasks.platform.prefect.remote import run_ranks, run_routed
from tasks.platform.redact import redacted


def run_stage(ctx: RunContext, cfg: PipelineConfig, stage: Stage, **inputs: Any) -> StageRecord:
    """Skip ``stage`` when a finished child run recorded its output; else run its body in
    the child run and record the output and wall time -> the record."""
    pause_point(f"before:{stage.name}")
    done = completed_output(ctx, stage.name)
    if done is not None:
        return stage.record.model_validate({**done, "skipped": True})
    start = time.perf_counter()
    gpu = ctx.device != "cpu" and torch.cuda.is_available()
    if gpu:  # the allocator's peak from here is the stage's own
        torch.cuda.reset_peak_memory_stats()
    resend_left(ctx.client(), ctx.workdir)  # a resume sends what a tracking outage left
    # the settings of the stage's config sections, flattened (ppo.kl_coef...)
    params = flatten(redacted({name: getattr(cfg, name).model_dump(mode="json")
                               for name in stage.sections})) if stage.sections else None
    with stage_run(ctx, stage.name, params) as run_id:
        out = execute(ctx, cfg, stage, run_id, inputs)
        # what the stage freed (Arrow's pool, glibc's heaps) back to the OS; no full garbage
        # collection: it is slow in this process
        pa.default_memory_pool().release_unused()
        trim_heap()
        peak = round(torch.cuda.max_memory_allocated() / 2**30, 3) if gpu else None
        out = out.model_copy(update={"run_id": run_id, "stage": stage.name,
                                     "wall_s": round(time.perf_counter() - start, 2),
                                     "peak_gpu_gb": peak})
        metric_logger(ctx, run_id)(0, {"time/stage_s": out.wall_s, **(
            {"memory/stage_peak_gpu_gb": out.peak_gpu_gb} if gpu else {})})
        record_output(ctx, run_id, out.model_dump(mode="json"))
    crash_point(f"after:{stage.name}")
    if in_prefect_run():  # the stage's key figures and its MLflow link in Prefect's UI
        from prefect.artifacts import create_markdown_artifact

        rows = "\n".join(f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |"
                         for k, v in {"wall_s": out.wall_s, **out.metrics, **out.figures}.items())
        md = (f"## {stage.name}\n\nMLflow: {run_url(ctx, run_id)}\n\n"
              f"| figure | value |\n|---|---|\n{rows}\n")
        create_markdown_artifact(key=f"rlhf-{stage.name.replace('_', '-')}", markdown=md,
                                 description=f"{stage.name} summary")
    return out


def execute(ctx: RunContext, cfg: PipelineConfig, stage: Stage, run_id: str,
            inputs: dict[str, Any]) -> StageRecord:
    """Run the body here, on torchrun ranks, or on the worker ``routing.stages`` names, owning
    the run folder meanwhile so it is not swept."""
    routed = cfg.routing.stages.get(stage.name)
    with owning(ctx.workdir):
        if routed:
            return stage.record.model_validate(
                run_routed(ctx, cfg, stage.name, run_id, inputs_json(inputs), routed))
        if stage.ranks and (cfg.model.nproc > 1 or cfg.model.nnodes > 1):
            return stage.record.model_validate(
                run_ranks(ctx, cfg, stage.name, run_id, inputs_json(inputs)))
        return stage.body(StageContext(ctx, cfg, stage, run_id), **inputs)


def inputs_json(inputs: dict[str, Any]) -> dict[str, Any]:
    """A stage's inputs for another process (records as JSON)."""
    return {k: v.model_dump(mode="json") if isinstance(v, BaseModel) else v
            for k, v in inputs.items()}


def typed_inputs(stage: Stage, inputs: dict[str, Any]) -> dict[str, Any]:
    """JSON inputs back into the records the body's signature names."""
    hints = typing.get_type_hints(stage.body)
    return {name: TypeAdapter(hints.get(name, Any)).validate_python(value)
            for name, value in inputs.items()}


def stage_task(stage: Stage) -> Task:
    """The stage's Prefect task ``task(ctx, cfg, *inputs)``, described by the stage module's
    docstring, the body's source its cache key."""
    param = inspect.Parameter.POSITIONAL_OR_KEYWORD
    signature = inspect.Signature(
        [inspect.Parameter("ctx", param, annotation=RunContext),
         inspect.Parameter("cfg", param, annotation=PipelineConfig), *stage.inputs],
        return_annotation=stage.record)

    def run(*args: Any, **kwargs: Any) -> StageRecord:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        inputs = dict(bound.arguments)
        return run_stage(inputs.pop("ctx"), inputs.pop("cfg"), stage, **inputs)

    run.__signature__ = signature
    run.__name__ = run.__qualname__ = stage.name  # Prefect's task key: one per stage
    run.__module__ = stage.body.__module__
    run.__doc__ = sys.modules[stage.body.__module__].__doc__
    run.__wrapped__ = stage.body  # what inspect.getsource, and so Prefect, reads as its source
    return StageTask(fn=run, name=stage.name)


class StageTask(Task):
    """A stage's Prefect task that draws graph edges only from the tasks it directly uses."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        bound = inspect.signature(self.fn).bind(*args, **kwargs)
        out = super().__call__(**direct_edges(dict(bound.arguments)))
        note_made_from(out, bound.arguments.values())
        return out


EDGE_KINDS = (StageRecord, Prepared)  # what tasks hand each other; the rest is run-wide

# id(record) -> (the record, kept alive so its id is not reused; ids it derives from)
_MADE_FROM: dict[int, tuple[BaseModel, frozenset[int]]] = {}


def _records(values: Iterable[Any]) -> list[BaseModel]:
    return [v for v in values if isinstance(v, EDGE_KINDS)]


def derived_from(value: Any) -> frozenset[int]:
    """Ids of every record ``value`` was made from (none for a record no task made)."""
    entry = _MADE_FROM.get(id(value))
    return entry[1] if entry is not None else frozenset()


def note_made_from(record: Any, inputs: Iterable[Any]) -> None:
    """Remember that ``record`` (a task's result) was made from the records in ``inputs``."""
    if not isinstance(record, BaseModel):
        return
    ids: set[int] = set()
    for value in _records(inputs):
        ids.add(id(value))
        ids.update(derived_from(value))
    _MADE_FROM[id(record)] = (record, frozenset(ids))


def latest(values: Iterable[Any]) -> list[BaseModel]:
    """The records among ``values`` that no other of them derives from."""
    records = _records(values)
    implied = set().union(*(derived_from(r) for r in records)) if records else set()
    return [r for r in records if id(r) not in implied]


def direct_edges(arguments: dict[str, Any]) -> dict[str, Any]:
    """``arguments`` with all but its latest records wrapped in ``quote`` (no edge), the run
    context too: it is part of prepare's result."""
    keep = {id(r) for r in latest(arguments.values())}
    return {name: value if id(value) in keep or value is None else quote(value)
            for name, value in arguments.items()}
