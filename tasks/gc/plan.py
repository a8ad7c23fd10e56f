"""`rlhf gc`: find what no longer serves (old run folders, runs deleted in MLflow, consumed
batches, pull records, stale cache entries), then, only when asked, delete it, one log line
each with its reason. Anything resumable or that an alias needs is kept; a run deleted in
MLflow goes, with the runs under it, ``tracking.gc_deleted_age_days`` after its deletion."""

from __future__ import annotations

import re
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Literal

from prefect import task
from pydantic import BaseModel, ConfigDict

from data_checks.cache import chunk_folder, validation_cache
from data_checks.validate import CHUNKS as GATE_CHUNKS
from rlhf_core.faults import pause_point
from tasks.config.pipeline_config import PipelineConfig
from tasks.gc.lock import one_gc
from tasks.gc.store import (
    StoredRun,
    alias_runs,
    deleted_experiments,
    deleted_runs,
    keeps_consumed_copy,
    local_folder,
    mark_pulled_all,
    purge_runs,
    stage_runs,
    stored_runs,
)
from tasks.pipeline.retention import (
    TRASH,
    delete_path,
    owner_lock_kept,
    remove_tree,
    trash_in,
    tree_bytes,
    unowned,
)
from tasks.platform.mlflow.addresses import default_tracking_uri
from tasks.retrain.batches import BATCH_SUFFIXES, file_digest
from tasks.retrain.labels.imports import QUARANTINE
from tasks.retrain.labels.pull import pulled_in_full
from tasks.retrain.store import consumed_batches

Kind = Literal["run folder", "trash", "leftover", "mlflow run", "batch", "pull record", "cache"]
DAY_S = 86400.0
AGE_KEY = "tracking.gc_deleted_age_days"
# what a killed gate or stage leaves: unfinished files and a checkpoint save's temp folder
LEFTOVERS = ("*.part", ".*.tmp")
STOPPED = "left by a deletion that was stopped midway"
RUN_ID, CACHE_KEY = re.compile("[0-9a-f]{32}"), re.compile("[0-9a-f]{64}")  # folder names


class Found(BaseModel):
    """One thing gc looked at: a path or a run id, whether it goes, and why (or why not)."""

    model_config = ConfigDict(frozen=True)
    kind: Kind
    target: str
    delete: bool
    reason: str
    bytes: int = 0
    pairs: int = 0  # a pull record: its collection's pairs, all pulled
    runs: list[str] = []  # a deleted pipeline run: its stage runs, purged with it

    def line(self) -> str:
        size = "" if not self.bytes else f" ({self.bytes / 1e6:.1f} MB)" \
            if self.bytes >= 100_000 else f" ({self.bytes / 1e3:.1f} kB)"
        return f"{self.kind} {self.target}{size}: {self.reason}"


class GcPlan(BaseModel):
    """Everything gc found, in the order it deletes; ``notes`` say what it could not do."""

    model_config = ConfigDict(frozen=True)
    tracking_uri: str
    found: list[Found]
    notes: list[str] = []

    @property
    def deletions(self) -> list[Found]:
        return [f for f in self.found if f.delete]

    @property
    def kept(self) -> list[Found]:
        return [f for f in self.found if not f.delete]


def _found(kind: Kind, path: Path, reason: str, delete: bool = True, **more) -> Found:
    return Found(kind=kind, target=str(path), delete=delete, reason=reason,
                 bytes=tree_bytes(path) if delete else 0, **more)


def _run_folders(cfg: PipelineConfig, uri: str, keep: int, needed: dict[str, str]) -> list[Found]:
    root = Path(cfg.tracking.workdir)
    if not root.is_dir():
        return []
    out = [_found("trash", p, STOPPED) for p in trash_in(root)]
    folders = {p.name: p for p in root.iterdir() if p.is_dir() and RUN_ID.fullmatch(p.name)}
    runs = stored_runs(uri, sorted(folders))
    finished = []
    for run_id, path in sorted(folders.items()):
        run = runs.get(run_id)
        if run is None:
            why = f"the store at {uri} has no run {run_id} (another store's?)"
        elif run_id in needed:
            why = f"needed by {needed[run_id]}"
        elif run.deleted:
            out.append(_found("run folder", path, "its run is marked deleted in MLflow"))
            continue
        elif run.status != "FINISHED":
            why = f"{run.status}: kept until resumed, or deleted in MLflow (resume state)"
        else:
            finished.append((run.end_time or 0, run_id, path))
            continue
        out += [_found("run folder", path, why, delete=False), *_leftovers(path, run)]
    finished.sort(reverse=True)  # newest first
    for n, (ended, run_id, path) in enumerate(finished):
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(ended / 1000))
        if n < keep:
            out += [_found("run folder", path, f"finished {when}, among the newest {keep} "
                           "finished runs", delete=False), *_leftovers(path, runs[run_id])]
        else:
            out.append(_found("run folder", path, f"finished {when}, older than the newest "
                              f"{keep} finished runs (tracking.gc_keep_runs)"))
    return out


def _leftovers(folder: Path, run) -> list[Found]:
    """What a killed gate or stage left in a kept run folder, once no live process owns it
    (without an owner lock: those a day old or more)."""
    found = {p for pattern in LEFTOVERS for p in folder.rglob(pattern)}
    if run is not None and run.validate_only:
        found |= {p for p in folder.glob(f"*/{GATE_CHUNKS}") if p.is_dir()}
    paths = sorted(p for p in found if not any(q in p.parents for q in found))
    if not paths:
        return []
    if owner_lock_kept(folder):
        with unowned(folder) as free:
            pass
        if not free:
            return [_found("leftover", folder, "a live process owns the run folder (a stage "
                           f"runs in it): its {len(paths)} unfinished file(s) stay", delete=False)]
        why = "no live process owns the run folder"
    else:
        paths = [p for p in paths if _old(p, 1, time.time())]
        why = "a day old or more, in a run folder no stage has locked"
    return [_found("leftover", p, f"left by a killed gate or stage; {why}") for p in paths]


def _old(path: Path, max_age_days: float, now: float) -> bool:
    return now - path.stat().st_mtime > max_age_days * DAY_S


def _deleted_run(top: StoredRun, under: list[StoredRun], needed: dict[str, str],
                 age_days: float, now: float) -> Found:
    """One deleted run with the runs under it, kept or purged."""
    group = [top, *under]
    size = sum(tree_bytes(p) for r in group if (p := local_folder(r.artifact_uri)))
    need = next((needed[r] for r in [top.parent_run_id, *(g.run_id for g in group)]
                 if r in needed), None)
    if top.deleted_time is None:
        days, when = None, "at a time the store did not record"
    else:
        days = max(0.0, now - top.deleted_time / 1000) / DAY_S
        when = f"{days:.1f} days ago"
    stages = f", with the {len(under)} run(s) under it" if under else ""
    if need:
        reason, delete = f"marked deleted {when}, but needed by {need}: restore it", False
    elif age_days > 0 and (days is None or days < age_days):
        reason, delete = (f"marked deleted {when}{stages}: purged {age_days:g} days after its "
                          f"deletion ({AGE_KEY}); until then the MLflow UI can restore it"), False
    else:
        reason, delete = (f"marked deleted {when}{stages}: removed with the artifacts by "
                          "`mlflow gc`"), True
    return Found(kind="mlflow run", target=top.run_id, delete=delete, bytes=size,
                 runs=[r.run_id for r in under], reason=reason)


def _deleted_runs(uri: str, needed: dict[str, str], age_days: float,
                  now: float) -> tuple[list[Found], list[str]]:
    """One item per topmost deleted run, and notes on what gc cannot do."""
    runs = deleted_runs(uri)
    if not runs:
        return [], []
    ids = {r.run_id for r in runs}
    tops = [r for r in runs if r.parent_run_id not in ids]
    under = stage_runs(uri, [r.run_id for r in tops])
    out = [_deleted_run(top, under[top.run_id], needed, age_days, now) for top in tops]
    notes = []
    if uri.startswith(("http://", "https://")):
        purge = ",".join(i for f in out if f.delete for i in (f.target, *f.runs))
        out = [f.model_copy(update={"delete": False}) for f in out]
        notes.append(f"runs marked deleted on the tracking server {uri} are collected where "
                     f"it runs: `mlflow gc --backend-store-uri <its database> --run-ids "
                     f"{purge}`")
    gone = deleted_experiments(uri)
    held = sorted({top.experiment_id for top, f in zip(tops, out) if not f.delete} & set(gone))
    if held:  # `mlflow gc` removes a deleted experiment whole, with the runs kept above
        out = [f.model_copy(update={"delete": False}) for f in out]
        notes.append(f"experiments {', '.join(held)} are marked deleted and `mlflow gc` would "
                     "remove them whole, while a run of theirs above is kept: nothing is "
                     "purged until it may go (or is restored)")
    elif gone and any(f.delete for f in out):
        notes.append(f"`mlflow gc` also removes the experiments marked deleted: {', '.join(gone)}")
    return out, notes


def _batches(cfg: PipelineConfig, uri: str, now: float) -> list[Found]:
    watch = Path(cfg.retrain.watch_dir)
    if not watch.is_dir():
        return []
    days = cfg.retrain.gc_batch_age_days
    age = f"older than {days:g} days (retrain.gc_batch_age_days)"
    files = sorted(p for p in watch.iterdir() if p.is_file() and p.suffix in BATCH_SUFFIXES)
    consumed = consumed_batches(cfg) if files else {}
    out = []
    for path in files:
        run_id = consumed.get(file_digest(path))
        if run_id is None:
            why = "no retrain consumed it yet"
        elif not _old(path, days, now):
            why = f"consumed by run {run_id}, not {age}"
        elif not keeps_consumed_copy(uri, run_id, file_digest(path)):
            why = f"consumed by run {run_id}, which keeps no copy of it"
        else:
            out.append(_found("batch", path, f"consumed by run {run_id} (which keeps its "
                              f"copy), {age}"))
            continue
        out.append(_found("batch", path, why, delete=False))
    quarantined = watch / QUARANTINE
    for path in sorted(quarantined.iterdir()) if quarantined.is_dir() else []:
        if path.is_file() and not path.name.startswith(TRASH):
            old = _old(path, days, now)
            why = f"quarantined, {'' if old else 'not '}{age}"
            out.append(_found("batch", path, why, delete=old))
    return out + [_found("trash", p, STOPPED) for p in trash_in(watch) + trash_in(quarantined)]


def _pulls(cfg: PipelineConfig) -> list[Found]:
    root = Path(cfg.collect.out_dir) / "pulls"
    out = [_found("trash", p, STOPPED) for p in trash_in(root)]
    return out + [_found("pull record", folder, f"collection {cid}: all {pairs} pairs pulled "
                         "and imported", pairs=pairs) for cid, folder, pairs in pulled_in_full(cfg)]


def _cache(cfg: PipelineConfig, now: float) -> list[Found]:
    """Validation cache entries unused for ``tracking.gc_cache_age_days``; those used, one line."""
    cache = validation_cache()
    if cache is None or not cache.root.is_dir():
        return []
    days = cfg.tracking.gc_cache_age_days
    chunks = chunk_folder(cache)
    items = [p for p in cache.root.iterdir() if p.is_dir() and CACHE_KEY.fullmatch(p.name)]
    items += [p for p in chunks.glob("*.arrow") if CACHE_KEY.fullmatch(p.stem)]
    out, used = [], []
    for path in sorted(items):
        if not _old(path, days, now):
            used.append(path)
            continue
        what = "tokenized chunk" if path.parent == chunks else "passed validation"
        out.append(_found("cache", path, f"{what} unused for {days:g} days "
                          "(tracking.gc_cache_age_days)"))
    if used:
        n = sum(p.parent == chunks for p in used)
        out.append(_found("cache", cache.root, f"{len(used) - n} passed validations and {n} "
                          f"tokenized chunks used within {days:g} days", delete=False))
    leftovers = [p for folder in (cache.root, chunks) if folder.is_dir()
                 for p in folder.iterdir() if p.name.startswith(".") and _old(p, 1, now)]
    return out + [_found("trash", p, "left by a write or deletion stopped midway, a day ago or "
                         "more") for p in sorted(leftovers)]


def plan_gc(cfg: PipelineConfig, keep_runs: int | None = None) -> GcPlan:
    """What gc would delete and keep, and why (deletes nothing). ``keep_runs`` overrides
    tracking.gc_keep_runs."""
    uri = default_tracking_uri(cfg.tracking.tracking_uri)
    t, now = cfg.tracking, time.time()
    keep = t.gc_keep_runs if keep_runs is None else keep_runs
    needed = alias_runs(uri, (t.registered_policy, t.registered_reward_model))
    mlflow_runs, notes = _deleted_runs(uri, needed, t.gc_deleted_age_days, now)
    found = [*_run_folders(cfg, uri, keep, needed), *mlflow_runs, *_batches(cfg, uri, now),
             *_pulls(cfg), *_cache(cfg, now)]
    return GcPlan(tracking_uri=uri, found=found, notes=notes)


class GcResult(BaseModel):
    """What a gc run found (its plan) and what it deleted (empty: a dry run)."""

    model_config = ConfigDict(frozen=True)
    plan: GcPlan
    deleted: list[Found]


@task(name="gc")
def collect_garbage(cfg: PipelineConfig, delete: bool) -> GcResult:
    """Find what no longer serves and, with ``delete``, delete it, one log line each."""
    with one_gc(cfg) if delete else nullcontext():
        plan = plan_gc(cfg)
        for item in plan.kept:
            print(f"gc: kept {item.line()}")
        for note in plan.notes:
            print(f"gc: {note}")
        return GcResult(plan=plan, deleted=apply_gc(cfg, plan) if delete else [])


def apply_gc(cfg: PipelineConfig, plan: GcPlan) -> list[Found]:
    """Delete what ``plan`` marks for deletion, one log line each -> what went (the runs
    deleted in MLflow last, purged with the runs under them)."""
    pause_point("gc:delete")
    done, runs = [], [f for f in plan.deletions if f.kind == "mlflow run"]
    for item in plan.deletions:
        path = Path(item.target)
        if item.kind == "mlflow run" or not path.exists() and not path.is_symlink():
            continue  # an mlflow run: purged below; a path gone meanwhile: another gc's
        if item.kind == "leftover":
            if not _sweep(cfg, path):
                continue
        else:
            if item.kind == "pull record":
                mark_pulled_all(plan.tracking_uri, cfg.tracking.experiment, path.name, item.pairs)
            remove_tree(path, f"gc:{item.kind.replace(' ', '_')}")
        print(f"gc: deleted {item.line()}")
        done.append(item)
    if runs:
        purge_runs(plan.tracking_uri, [i for f in runs for i in (f.target, *f.runs)])
    for item in runs:
        print(f"gc: deleted {item.line()}")
    return done + runs


def _sweep(cfg: PipelineConfig, path: Path) -> bool:
    """Delete a leftover in place (not renamed: a leftover cut short is still one), under its
    run folder's owner lock -> False when a process took the folder since the plan."""
    root = Path(cfg.tracking.workdir)
    folder = root / path.relative_to(root).parts[0]
    with unowned(folder) if owner_lock_kept(folder) else nullcontext(True) as free:
        if not free:
            print(f"gc: kept {path}: a process owns its run folder again")
            return False
        delete_path(path)
    return True
