"""MLflow bookkeeping, with explicit run ids everywhere (MLflow's active run is per thread).

One parent run per pipeline run, one child run per stage tagged ``rlhf.stage``. A stage whose
child run finished with its output recorded (tag ``rlhf.output``) is skipped on a re-run.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from pydantic import BaseModel, ConfigDict

from rlhf_core.hardware import hardware_facts
from tasks.platform.mlflow.addresses import (  # noqa: F401  (re-exported)
    default_tracking_uri,
    run_page,
    runs_table_url,
)
from tasks.platform.mlflow.last_run import note_parent_run
from tasks.platform.mlflow.tags import (
    EXPERIMENT_KIND_TAG,
    HW_PREFIX,
    OUTPUT_TAG,
    PARENT_TAG,
    STAGE_TAG,
)
from tasks.platform.redact import redact

_log = logging.getLogger("rlhf.tracking")


class RunContext(BaseModel):
    """What every stage task needs to know about the pipeline run (small, serialisable)."""

    model_config = ConfigDict(frozen=True)
    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    workdir: str
    seed: int
    progress: bool = True
    outage_limit_s: float = 600.0
    device: str = "auto"  # the stages' resolved model.device, for their rlhf.hw.gpu tag
    run_name: str = ""  # the parent run's name: the same in MLflow, Prefect and the summary

    def model_post_init(self, _context: Any) -> None:
        note_parent_run(self.parent_run_id)  # for the CLI's message on a stop signal

    def client(self) -> MlflowClient:
        """A client whose calls wait at most ``outage_limit_s`` for a server that went away
        (tasks/platform/mlflow/guarded.py GuardedClient), then stop the run with the resume
        command."""
        from tasks.platform.mlflow.guarded import guarded

        return guarded(MlflowClient(tracking_uri=self.tracking_uri), self.outage_limit_s,
                       self.parent_run_id, self.workdir)

    def stage_dir(self, stage: str) -> Path:
        path = Path(self.workdir) / stage
        path.mkdir(parents=True, exist_ok=True)
        return path



def resolved_store(uri: str) -> str:
    """The store a URI names, the same from any working folder: a local SQLite or file store
    as its absolute path (a server URI as it is, the same on every machine)."""
    for scheme in ("sqlite:///", "file://"):
        if uri.startswith(scheme):
            return scheme + str(Path(uri.removeprefix(scheme)).resolve())
    return uri if "://" in uri else "file://" + str(Path(uri).resolve())


def ensure_store(uri: str) -> None:
    """Create (migrate) a new local SQLite store under a file lock, so two pipelines started
    at once on a new store do not both run MLflow's schema migration (one would die with
    'duplicate column name'); other stores are left to their server."""
    if not uri.startswith("sqlite:///"):
        return
    import fcntl

    db = Path(uri.removeprefix("sqlite:///"))
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def tracking_client(tracking_uri: str) -> MlflowClient:
    """A plain MLflow client of the store at ``tracking_uri``, for work outside a pipeline
    run's stages (opening the run, collections, label imports, retrain bookkeeping); a
    stage's client waits out a server outage instead (RunContext.client)."""
    return MlflowClient(tracking_uri=tracking_uri)


def experiment_client(tracking_uri: str, experiment: str) -> tuple[MlflowClient, str | None]:
    """A plain client of the store at ``tracking_uri`` and the id of ``experiment`` there
    (None: no such experiment yet; nothing is created)."""
    client = tracking_client(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    return client, None if exp is None else exp.experiment_id


def artifact_location(tracking_uri: str) -> str | None:
    """``<db folder>/mlruns`` for a local SQLite store, so artifacts live beside their runs
    whatever the working folder (MLflow's default is ``./mlruns`` of the current one)."""
    if not tracking_uri.startswith("sqlite:///"):
        return None  # a server decides (served artifacts), or MLflow's own default
    db = Path(tracking_uri.removeprefix("sqlite:///")).resolve()
    return (db.parent / "mlruns").as_uri()


# MLflow 3's UI opens an experiment of this kind on its runs table and metric charts, not on
# its GenAI (traces) view
EXPERIMENT_KIND = {EXPERIMENT_KIND_TAG: "custom_model_development"}


def ensure_experiment(client: MlflowClient, name: str, uri: str) -> str:
    """The id of the experiment ``name`` in the store at ``uri``, created when missing (with
    its artifacts beside a local store, :func:`artifact_location`, and the kind tag that
    opens it on its runs table); an existing one without the kind tag gets it."""
    from mlflow.exceptions import MlflowException

    exp = client.get_experiment_by_name(name)
    if exp:
        if EXPERIMENT_KIND_TAG not in exp.tags:
            client.set_experiment_tag(exp.experiment_id, *next(iter(EXPERIMENT_KIND.items())))
        return exp.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location(uri),
                                        tags=EXPERIMENT_KIND)
    except MlflowException as err:
        # another pipeline run on the same server created it between our lookup and create
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return client.get_experiment_by_name(name).experiment_id


def log_metrics(client: MlflowClient, run_id: str, metrics: dict[str, float],
                step: int) -> None:
    """One batch call for a whole metrics dict at ``step``."""
    now = int(time.time() * 1000)
    batch = [Metric(k, float(v), now, step) for k, v in metrics.items() if v == v]  # drop NaN
    for start in range(0, len(batch), 900):
        client.log_batch(run_id, metrics=batch[start: start + 900])


class StepLogger:
    """Log metrics to one run, skipping (key, step) pairs the run already holds.

    A stage resumed from its last checkpoint recomputes the steps after it; they were logged
    before the crash (with the same values, as the run is deterministic) and are not logged
    twice, so every metric history keeps one value per step. With a ``spool``
    (tasks/platform/mlflow/spool.py) the writes go through it, and the steps it still holds count
    as logged.
    """

    def __init__(self, client: MlflowClient, run_id: str, spool=None):
        self.client, self.run_id, self.spool = client, run_id, spool
        # one call, no metric history: a run's latest metric of a key is the one at its
        # highest step (MLflow orders by step, then time), which is all a resume needs
        latest = client.get_run(run_id).to_proto().data.metrics
        self.last_step: dict[str, int] = {m.key: m.step for m in latest}
        for record in spool.pending() if spool is not None else []:
            for key, _value, _ts, step in record.get("metrics", []):
                self.last_step[key] = max(step, self.last_step.get(key, -1))

    def __call__(self, step: int, metrics: dict[str, float]) -> None:
        fresh = {k: v for k, v in metrics.items() if step > self.last_step.get(k, -1)}
        if not fresh:
            return
        if self.spool is None:
            log_metrics(self.client, self.run_id, fresh, step)
        else:
            now = int(time.time() * 1000)
            rows = [[k, float(v), now, step] for k, v in fresh.items() if v == v]  # no NaN
            for start in range(0, len(rows), 900):
                self.spool.write({"kind": "batch", "metrics": rows[start: start + 900]})
        self.last_step.update(dict.fromkeys(fresh, step))


def log_params(client: MlflowClient, run_id: str, params: dict[str, Any]) -> None:
    items = [Param(k, str(v)[:6000]) for k, v in params.items()]
    for start in range(0, len(items), 90):
        client.log_batch(run_id, params=items[start: start + 90])


def run_tags(client: MlflowClient, run_id: str) -> dict[str, str]:
    return client.get_run(run_id).data.tags


def set_tags(client: MlflowClient, run_id: str, tags: dict[str, str]) -> None:
    client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])


def hardware_tags(device: Any = None) -> dict[str, str]:
    """``rlhf.hw.*``: the machine and build that run here on ``device`` (its CPU and the
    instruction set of torch's CPU kernels, thread count, GPU, torch and CUDA versions),
    read now: after the process set its thread count."""
    return {HW_PREFIX + key: value for key, value in hardware_facts(device).items()}


def find_stage_run(ctx: RunContext, stage: str):
    """The child run of ``stage`` under the parent, or None."""
    runs = ctx.client().search_runs(
        [ctx.experiment_id],
        filter_string=f"tags.`{PARENT_TAG}` = '{ctx.parent_run_id}' "
                      f"and tags.`{STAGE_TAG}` = '{stage}'",
        max_results=1,
    )
    return runs[0] if runs else None


def completed_output(ctx: RunContext, stage: str) -> dict | None:
    """The recorded output of a finished stage (to skip it on a re-run), else None."""
    run = find_stage_run(ctx, stage)
    if run is None or run.info.status != "FINISHED" or OUTPUT_TAG not in run.data.tags:
        return None
    return json.loads(run.data.tags[OUTPUT_TAG])


@contextmanager
def stage_run(ctx: RunContext, stage: str,
              params: dict[str, Any] | None = None) -> Iterator[str]:
    """Open (or reopen) the child run of ``stage``; FINISHED on success, FAILED on error. A new
    child run gets ``params`` (its stage's settings), so two runs' stages compare in MLflow.
    Either gets the ``rlhf.hw.*`` tags of this machine (a routed stage's machine, or rank 0
    of a torchrun stage, writes its own over them: flows/stage.py,
    tasks/pipeline/stages/rank_main.py)."""
    client = ctx.client()
    existing = find_stage_run(ctx, stage)
    if existing is not None:
        run_id = existing.info.run_id
        client.update_run(run_id, status="RUNNING")
    else:
        run = client.create_run(ctx.experiment_id, run_name=stage,
                                tags={PARENT_TAG: ctx.parent_run_id, STAGE_TAG: stage})
        run_id = run.info.run_id
        if params:
            log_params(client, run_id, params)
    try:
        set_tags(client, run_id, hardware_tags(ctx.device))
        yield run_id
    except BaseException:
        _keep_traceback(client, run_id)
        mark_ended(client, run_id)
        raise
    client.set_terminated(run_id, status="FINISHED")


STOPS = ("KeyboardInterrupt", "TerminationSignal", "Stopped", "SystemExit")


def mark_ended(client: MlflowClient, run_id: str) -> None:
    """Called while an error propagates: mark ``run_id`` KILLED (a stop signal) or FAILED.
    A store that cannot be reached (or a stop's short deadline) never replaces the error:
    the run then stays RUNNING in the store, and ``--resume`` reopens it all the same."""
    client = getattr(client, "raw", client)  # no wait on a server that went away
    exc = sys.exc_info()[1]
    status = "KILLED" if exc is not None and type(exc).__name__ in STOPS else "FAILED"
    try:
        with _quick_if_outage():
            client.set_terminated(run_id, status=status)
    except Exception as err:  # noqa: BLE001 - the original error is the one to report
        _log.warning("could not mark MLflow run %s %s (%s: %s); it stays RUNNING in the store "
                     "and --resume reopens it", run_id, status, type(err).__name__, err)


def _quick_if_outage():
    """While a tracking outage stops the stage: one try per request, not MLflow's minutes
    of retries on the server that is gone."""
    from tasks.platform.mlflow.spool import TrackingOutage, fail_fast

    return fail_fast(3) if isinstance(sys.exc_info()[1], TrackingOutage) else nullcontext()


def _keep_traceback(client: MlflowClient, run_id: str) -> None:
    """The failure's traceback on the stage run (the terminal shows only the message)."""
    import traceback

    client = getattr(client, "raw", client)
    try:
        with _quick_if_outage():
            client.log_text(run_id, traceback.format_exc(), "error/traceback.txt")
    except Exception as err:  # noqa: BLE001 - never hide the original error behind a logging one
        _log.warning("could not keep the traceback on MLflow run %s (%s: %s)", run_id,
                     type(err).__name__, err)


def stage_run_tags(ctx: RunContext, run_id: str) -> dict[str, str]:
    """The tags on the stage run ``run_id`` (what another machine left on it)."""
    return ctx.client().get_run(run_id).data.tags


def record_output(ctx: RunContext, run_id: str, output: dict) -> dict:
    """Store the stage's small output reference on its run (read back by a re-run)."""
    ctx.client().set_tag(run_id, OUTPUT_TAG, json.dumps(output, sort_keys=True))
    return output


def tag_parent(ctx: RunContext, tags: dict[str, Any]) -> None:
    """Tags on the pipeline's parent run (values as text)."""
    set_tags(ctx.client(), ctx.parent_run_id, tags)


def run_url(ctx: RunContext, run_id: str) -> str:
    """A link to the run in the MLflow UI (server URIs), else a tracking-URI reference."""
    page = run_page(ctx.tracking_uri, ctx.experiment_id, run_id)
    uri = redact(ctx.tracking_uri)
    return page or (f"{uri} experiment {ctx.experiment_id} run {run_id} (open "
                    f"with `mlflow ui --backend-store-uri {uri}`)")


def retry_unique_key(write, attempts: int = 5) -> None:
    """Run ``write()``; when the tracking server refuses it on a unique key (a concurrent
    run wrote the same row first, seen on PostgreSQL), wait a little and run it again."""
    from mlflow.exceptions import MlflowException

    for attempt in range(attempts):
        try:
            write()
            return
        except MlflowException as err:
            if attempt == attempts - 1 or "unique" not in str(err).lower():
                raise
            time.sleep(0.2 * (attempt + 1))


@contextmanager
def system_metrics(ctx: RunContext, enabled: bool, interval_s: float) -> Iterator[None]:
    """CPU, memory, disk, network (and GPU with nvidia-ml-py) as ``system/*`` metrics on the
    parent run while the stages run; a resumed run continues the step count."""
    if not enabled:
        yield
        return
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    monitor = SystemMetricsMonitor(ctx.parent_run_id, sampling_interval=interval_s,
                                   resume_logging=True, tracking_uri=ctx.tracking_uri)
    monitor.start()
    try:
        yield
    finally:
        # the monitor's thread may sit in MLflow's retries on a server that went away: stop
        # waiting for it after a few seconds (it is a daemon thread)
        done = threading.Thread(target=monitor.finish, daemon=True)
        done.start()
        done.join(timeout=max(10.0, 2 * interval_s))
