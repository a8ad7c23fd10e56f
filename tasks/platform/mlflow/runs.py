"""MLflow bookkeeping with explicit run ids (MLflow's active run is per thread): one parent
run per pipeline run (found, created, reopened or ended, and a sweep's summary on it), one
child run per stage, skipped on a re-run once it finished with its output recorded."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from pydantic import BaseModel, ConfigDict

from rlhf_core.hardware import hardware_facts
from tasks.config.pipeline_config import flatten
from tasks.platform.mlflow.addresses import run_page
from tasks.platform.mlflow.errors import note_parent_run
from tasks.platform.mlflow.tags import (
    CONFIG_HASH_TAG,
    EXPERIMENT_KIND_TAG,
    HW_PREFIX,
    OUTPUT_TAG,
    PARENT_TAG,
    RESUMED_CONFIG_HASH_TAG,
    STAGE_TAG,
)
from tasks.platform.redact import redact

_log = logging.getLogger("rlhf.tracking")
PLOTS = "plots"  # the parent run's artifact folder of figures


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
        """A client that waits up to ``outage_limit_s`` for a lost HTTP server, then stops."""
        from tasks.platform.mlflow.guarded import GuardedClient

        client = MlflowClient(tracking_uri=self.tracking_uri)
        if not self.tracking_uri.startswith(("http://", "https://")):
            return client
        return GuardedClient(client, self.outage_limit_s, self.parent_run_id, self.workdir)

    def stage_dir(self, stage: str) -> Path:
        path = Path(self.workdir) / stage
        path.mkdir(parents=True, exist_ok=True)
        return path


def resolved_store(uri: str) -> str:
    """The URI with a local SQLite or file store made absolute (a server URI as it is)."""
    for scheme in ("sqlite:///", "file://"):
        if uri.startswith(scheme):
            return scheme + str(Path(uri.removeprefix(scheme)).resolve())
    return uri if "://" in uri else "file://" + str(Path(uri).resolve())


def ensure_store(uri: str) -> None:
    """Create a local SQLite store under a file lock: one schema migration for runs at once."""
    if not uri.startswith("sqlite:///"):
        return
    import fcntl

    db = Path(uri.removeprefix("sqlite:///"))
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".lock"), "w") as lock:  # closing it unlocks
        fcntl.flock(lock, fcntl.LOCK_EX)
        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)


def tracking_client(tracking_uri: str) -> MlflowClient:
    """A plain client, for work outside the stages (whose client waits out an outage)."""
    return MlflowClient(tracking_uri=tracking_uri)


def experiment_client(tracking_uri: str, experiment: str) -> tuple[MlflowClient, str | None]:
    """A plain client and the id of ``experiment`` (None when missing; nothing is created)."""
    client = tracking_client(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    return client, None if exp is None else exp.experiment_id


def artifact_location(tracking_uri: str) -> str | None:
    """``<db folder>/mlruns`` for a local SQLite store: artifacts beside their runs."""
    if not tracking_uri.startswith("sqlite:///"):
        return None  # a server decides (served artifacts), or MLflow's own default
    db = Path(tracking_uri.removeprefix("sqlite:///")).resolve()
    return (db.parent / "mlruns").as_uri()


def ensure_experiment(client: MlflowClient, name: str, uri: str) -> str:
    """Experiment ``name``'s id (made if missing), tagged so MLflow 3's UI opens its runs table."""
    kind = "custom_model_development"
    exp = client.get_experiment_by_name(name)
    if exp:
        if EXPERIMENT_KIND_TAG not in exp.tags:
            client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, kind)
        return exp.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location(uri),
                                        tags={EXPERIMENT_KIND_TAG: kind})
    except MlflowException as err:
        # another pipeline run on the same server created it between our lookup and create
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return client.get_experiment_by_name(name).experiment_id


def log_metrics(client: MlflowClient, run_id: str, metrics: dict[str, float], step: int,
                spool=None) -> None:
    """``metrics`` at ``step`` (NaN dropped) in batch calls of 900, through ``spool`` if given."""
    now = int(time.time() * 1000)
    rows = [[k, float(v), now, step] for k, v in metrics.items() if v == v]
    for start in range(0, len(rows), 900):
        if spool is None:
            client.log_batch(run_id, metrics=[Metric(*row) for row in rows[start: start + 900]])
        else:
            spool.write({"kind": "batch", "metrics": rows[start: start + 900]})


class StepLogger:
    """Log metrics to one run, skipping (key, step) pairs it (or the ``spool``) already holds,
    so a resumed stage that recomputes steps keeps one value per step."""

    def __init__(self, client: MlflowClient, run_id: str, spool=None):
        self.client, self.run_id, self.spool = client, run_id, spool
        # a key's latest metric is the one at its highest step: all a resume needs
        latest = client.get_run(run_id).to_proto().data.metrics
        self.last_step: dict[str, int] = {m.key: m.step for m in latest}
        for record in spool.pending() if spool is not None else []:
            for key, _value, _ts, step in record.get("metrics", []):
                self.last_step[key] = max(step, self.last_step.get(key, -1))

    def __call__(self, step: int, metrics: dict[str, float]) -> None:
        fresh = {k: v for k, v in metrics.items() if step > self.last_step.get(k, -1)}
        log_metrics(self.client, self.run_id, fresh, step, self.spool)
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
    """``rlhf.hw.*`` tags of this machine and build on ``device`` (after threads are set)."""
    return {HW_PREFIX + key: value for key, value in hardware_facts(device).items()}


def find_stage_run(ctx: RunContext, stage: str):
    """The child run of ``stage`` under the parent, or None."""
    runs = ctx.client().search_runs([ctx.experiment_id], max_results=1,
                                    filter_string=f"tags.`{PARENT_TAG}` = '{ctx.parent_run_id}' "
                                                  f"and tags.`{STAGE_TAG}` = '{stage}'")
    return runs[0] if runs else None


def completed_output(ctx: RunContext, stage: str) -> dict | None:
    """The recorded output of a finished stage (to skip it on a re-run), else None."""
    run = find_stage_run(ctx, stage)
    if run is None or run.info.status != "FINISHED" or OUTPUT_TAG not in run.data.tags:
        return None
    return json.loads(run.data.tags[OUTPUT_TAG])


@contextmanager
def stage_run(ctx: RunContext, stage: str, params: dict[str, Any] | None = None) -> Iterator[str]:
    """Open (or reopen) the child run of ``stage``, tagged with this machine's ``rlhf.hw.*``;
    a new one gets ``params``. FINISHED on success, FAILED or KILLED on error."""
    client = ctx.client()
    existing = find_stage_run(ctx, stage)
    if existing is not None:
        run_id = existing.info.run_id
        client.update_run(run_id, status="RUNNING")
    else:
        run_id = client.create_run(ctx.experiment_id, run_name=stage, tags={
            PARENT_TAG: ctx.parent_run_id, STAGE_TAG: stage}).info.run_id
        if params:
            log_params(client, run_id, params)
    try:
        set_tags(client, run_id, hardware_tags(ctx.device))
        yield run_id
    except BaseException:
        trace = traceback.format_exc()  # kept on the run: the terminal shows only the message
        _while_failing(client, lambda raw: raw.log_text(run_id, trace, "error/traceback.txt"),
                       f"could not keep the traceback on MLflow run {run_id}")
        mark_ended(client, run_id)
        raise
    client.set_terminated(run_id, status="FINISHED")


def mark_ended(client: MlflowClient, run_id: str) -> None:
    """While an error propagates, mark ``run_id`` KILLED (a stop) or FAILED; a store that
    cannot be reached never replaces the error (the run stays RUNNING; ``--resume`` works)."""
    stop = type(sys.exc_info()[1]).__name__ in ("KeyboardInterrupt", "TerminationSignal",
                                                "Stopped", "SystemExit")
    status = "KILLED" if stop else "FAILED"
    _while_failing(client, lambda raw: raw.set_terminated(run_id, status=status),
                   f"could not mark MLflow run {run_id} {status}",
                   "; it stays RUNNING in the store and --resume reopens it")


def _while_failing(client: MlflowClient, write, failed: str, after: str = "") -> None:
    """``write(client)`` on the raw client while an error propagates (one try per request
    during an outage); its own failure is logged, never raised over the original error."""
    from tasks.platform.mlflow.spool import TrackingOutage, fail_fast

    outage = isinstance(sys.exc_info()[1], TrackingOutage)
    try:
        with fail_fast(3) if outage else nullcontext():
            write(getattr(client, "raw", client))
    except Exception as err:  # noqa: BLE001 - the original error is the one to report
        _log.warning("%s (%s: %s)%s", failed, type(err).__name__, err, after)


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


def retry_unique_key(write) -> None:
    """``write()``, tried up to 5 times while the server refuses it on a unique key (a race)."""
    for attempt in range(5):
        try:
            write()
            return
        except MlflowException as err:
            if attempt == 4 or "unique" not in str(err).lower():
                raise
            time.sleep(0.2 * (attempt + 1))


@contextmanager
def system_metrics(ctx: RunContext, enabled: bool, interval_s: float) -> Iterator[None]:
    """``system/*`` metrics on the parent run while the stages run."""
    if not enabled:
        yield
        return
    from mlflow.system_metrics import system_metrics_monitor as sm

    logging.getLogger(sm.__name__).setLevel(logging.WARNING)  # not its start and stop lines
    monitor = sm.SystemMetricsMonitor(ctx.parent_run_id, sampling_interval=interval_s,
                                      resume_logging=True, tracking_uri=ctx.tracking_uri)
    monitor.start()
    try:
        yield
    finally:
        # its thread may sit in MLflow's retries on a lost server: don't wait for it forever
        done = threading.Thread(target=monitor.finish, daemon=True)
        done.start()
        done.join(timeout=max(10.0, 2 * interval_s))


def parent_runs(client: MlflowClient, experiment_id: str, tag: str, value: str) -> list:
    """Parent runs among the experiment's latest runs whose ``tag`` is ``value``, newest first."""
    runs = client.search_runs([experiment_id], filter_string=f"tags.`{tag}` = '{value}'",
                              max_results=20, order_by=["attributes.start_time DESC"])
    return [r for r in runs if PARENT_TAG not in r.data.tags]


def run_to_resume(client: MlflowClient, run_id: str):
    """The run ``run_id`` (a clear MlflowException for a wrong id)."""
    return client.get_run(run_id)


def reopen_run(client: MlflowClient, run, config: dict[str, Any], config_hash: str) -> None:
    """Mark ``run`` RUNNING again; resumed with changed settings (another config hash), it
    keeps the config it continues with beside the first one."""
    run_id = run.info.run_id
    client.update_run(run_id, status="RUNNING")
    if run.data.tags.get(CONFIG_HASH_TAG) != config_hash:
        client.log_dict(run_id, config, f"config/resumed_config_{config_hash}.json")
        set_tags(client, run_id, {RESUMED_CONFIG_HASH_TAG: config_hash})


def end_run(client: MlflowClient, run_id: str, status: str) -> None:
    client.set_terminated(run_id, status=status)


def create_parent_run(client: MlflowClient, experiment_id: str, run_name: str,
                      tags: dict[str, str], config: dict[str, Any]) -> str:
    """A new pipeline run with its tags and resolved config (and as parameters) -> its id."""
    run_id = client.create_run(experiment_id, run_name=run_name).info.run_id
    log_params(client, run_id, flatten(config))
    set_tags(client, run_id, tags)
    client.log_dict(run_id, config, "config/resolved_config.json")
    return run_id


def stage_metric_histories(ctx: RunContext, stage: str, keys: list[str]) -> dict | None:
    """{key: [Metric]} over the steps of the stage's run; None when the stage has no run."""
    run = find_stage_run(ctx, stage)
    if run is None:
        return None
    client = ctx.client()
    return {key: client.get_metric_history(run.info.run_id, key) for key in keys}


def log_sweep_summary(ctx: RunContext, rows: list[dict], groups: list[dict], markdown: str) -> None:
    """A sweep's tables and markdown summary on the sweep's run (``sweep/``)."""
    import pandas as pd

    client = ctx.client()
    client.log_table(ctx.parent_run_id, data=pd.DataFrame(rows), artifact_file="sweep/points.json")
    if groups:
        client.log_table(ctx.parent_run_id, data=pd.DataFrame(groups),
                         artifact_file="sweep/summary.json")
    client.log_text(ctx.parent_run_id, markdown, "sweep/summary.md")
