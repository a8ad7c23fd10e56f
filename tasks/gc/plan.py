"""`rlhf gc`: find what no longer serves (old run folders, runs deleted in MLflow, consumed
batches, pull records, stale cache entries), then, only when asked, delete it, one log line
each with its reason. Anything resumable or that an alias needs is kept."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

from prefect import task
from pydantic import BaseModel, ConfigDict

from data_checks.cache import chunk_folder, validation_cache
from data_checks.validate import CHUNKS as GATE_CHUNKS
from rlhf_core.faults import pause_point
from tasks.config.pipeline_config import PipelineConfig
from tasks.gc.deleted import deleted_run_items, purge
from tasks.gc.items import DAY_S, Found, GcPlan, is_hex
from tasks.gc.lock import one_gc
from tasks.gc.store import (
    alias_runs,
    keeps_consumed_copy,
    mark_pulled_all,
    stored_runs,
)
from tasks.pipeline.owners import owner_lock_kept, unowned
from tasks.pipeline.retention import TRASH, remove_tree, trash_in, tree_bytes
from tasks.platform.mlflow.runs import default_tracking_uri, resolved_store
from tasks.retrain.batches import BATCH_SUFFIXES, file_digest
from tasks.retrain.labels.imports import QUARANTINE
from tasks.retrain.labels.pull import pulled_in_full
from tasks.retrain.store import consumed_batches

# what a killed gate or stage leaves: unfinished files and a checkpoint save's temp folder
LEFTOVERS = ("*.part", ".*.tmp")


@contextmanager
def one_gc_of(cfg: PipelineConfig) -> Iterator[None]:
    """One gc at a time of the config's store: a second waits for it."""
    with one_gc(resolved_store(default_tracking_uri(cfg.tracking.tracking_uri))):
        yield


def _run_folders(cfg: PipelineConfig, uri: str, keep: int,
                 needed: dict[str, str]) -> list[Found]:
    root = Path(cfg.tracking.workdir)
    if not root.is_dir():
        return []
    out = [Found(kind="trash", target=str(p), delete=True, bytes=tree_bytes(p),
                 reason="left by a deletion that was stopped midway") for p in trash_in(root)]
    folders = {p.name: p for p in root.iterdir() if p.is_dir() and is_hex(p.name, 32)}
    runs = stored_runs(uri, sorted(folders))
    finished = []
    for run_id, path in sorted(folders.items()):
        run = runs.get(run_id)
        if run is None:
            why = f"the store at {uri} has no run {run_id} (another store's?)"
        elif run_id in needed:
            why = f"needed by {needed[run_id]}"
        elif run.deleted:
            out.append(Found(kind="run folder", target=str(path), delete=True,
                             bytes=tree_bytes(path), reason="its run is marked deleted in MLflow"))
            continue
        elif run.status != "FINISHED":
            why = f"{run.status}: kept until resumed, or deleted in MLflow (resume state)"
        else:
            finished.append((run.end_time or 0, run_id, path))
            continue
        out.append(Found(kind="run folder", target=str(path), delete=False, reason=why))
        out += _leftovers(path, run)
    finished.sort(reverse=True)  # newest first
    for n, (ended, run_id, path) in enumerate(finished):
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(ended / 1000))
        if n < keep:
            out.append(Found(kind="run folder", target=str(path), delete=False,
                             reason=f"finished {when}, among the newest {keep} finished runs"))
            out += _leftovers(path, runs[run_id])
        else:
            out.append(Found(kind="run folder", target=str(path), delete=True,
                             bytes=tree_bytes(path), reason=f"finished {when}, older than the "
                             f"newest {keep} finished runs (tracking.gc_keep_runs)"))
    return out


def _leftovers(folder: Path, run, now: float | None = None) -> list[Found]:
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
            return [Found(kind="leftover", target=str(folder), delete=False,
                          reason="a live process owns the run folder (a stage runs in it): "
                                 f"its {len(paths)} unfinished file(s) stay")]
        why = "no live process owns the run folder"
    else:
        now = time.time() if now is None else now
        paths = [p for p in paths if _old(p, 1, now)]
        why = "a day old or more, in a run folder no stage has locked"
    return [Found(kind="leftover", target=str(p), delete=True, bytes=tree_bytes(p),
                  reason=f"left by a killed gate or stage; {why}") for p in paths]


def _old(path: Path, max_age_days: float, now: float) -> bool:
    return now - path.stat().st_mtime > max_age_days * DAY_S


def _batches(cfg: PipelineConfig, uri: str, now: float) -> list[Found]:
    watch = Path(cfg.retrain.watch_dir)
    if not watch.is_dir():
        return []
    days = cfg.retrain.gc_batch_age_days
    age = f"older than {days:g} days (retrain.gc_batch_age_days)"
    files = sorted(p for p in watch.iterdir() if p.is_file() and p.suffix in BATCH_SUFFIXES)
    consumed = consumed_batches(uri, cfg.tracking.experiment) if files else {}
    out = []
    for path in files:
        run_id = consumed.get(file_digest(path))
        if run_id is None:
            out.append(Found(kind="batch", target=str(path), delete=False,
                             reason="no retrain consumed it yet"))
        elif not _old(path, days, now):
            out.append(Found(kind="batch", target=str(path), delete=False,
                             reason=f"consumed by run {run_id}, not {age}"))
        elif not keeps_consumed_copy(uri, run_id, file_digest(path)):
            out.append(Found(kind="batch", target=str(path), delete=False,
                             reason=f"consumed by run {run_id}, which keeps no copy of it"))
        else:
            out.append(Found(kind="batch", target=str(path), delete=True, bytes=tree_bytes(path),
                             reason=f"consumed by run {run_id} (which keeps its copy), {age}"))
    quarantined = watch / QUARANTINE
    for path in sorted(quarantined.iterdir()) if quarantined.is_dir() else []:
        if not path.is_file() or path.name.startswith(TRASH):
            continue
        old = _old(path, days, now)
        out.append(Found(kind="batch", target=str(path), delete=old,
                         bytes=tree_bytes(path) if old else 0,
                         reason=f"quarantined, {'' if old else 'not '}{age}"))
    return out + [Found(kind="trash", target=str(p), delete=True, bytes=tree_bytes(p),
                        reason="left by a deletion that was stopped midway")
                  for p in trash_in(watch) + trash_in(quarantined)]


def _pulls(cfg: PipelineConfig) -> list[Found]:
    root = Path(cfg.collect.out_dir) / "pulls"
    out = [Found(kind="trash", target=str(p), delete=True, bytes=tree_bytes(p),
                 reason="left by a deletion that was stopped midway") for p in trash_in(root)]
    return out + [Found(kind="pull record", target=str(folder), delete=True,
                        bytes=tree_bytes(folder), pairs=pairs,
                        reason=f"collection {cid}: all {pairs} pairs pulled and imported")
                  for cid, folder, pairs in pulled_in_full(cfg)]


def _cache(cfg: PipelineConfig, now: float) -> list[Found]:
    """Validation cache entries unused for ``tracking.gc_cache_age_days``; those in use as
    one line."""
    cache = validation_cache()
    if cache is None or not cache.root.is_dir():
        return []
    days = cfg.tracking.gc_cache_age_days
    chunks = chunk_folder(cache)
    items = [p for p in cache.root.iterdir() if p.is_dir() and is_hex(p.name, 64)]
    items += [p for p in chunks.iterdir() if p.suffix == ".arrow" and is_hex(p.stem, 64)] \
        if chunks.is_dir() else []
    out, used = [], []
    for path in sorted(items):
        if not _old(path, days, now):
            used.append(path)
            continue
        what = "tokenized chunk" if path.parent == chunks else "passed validation"
        out.append(Found(kind="cache", target=str(path), delete=True, bytes=tree_bytes(path),
                         reason=f"{what} unused for {days:g} days "
                                "(tracking.gc_cache_age_days)"))
    if used:
        n = sum(p.parent == chunks for p in used)
        out.append(Found(kind="cache", target=str(cache.root), delete=False,
                         reason=f"{len(used) - n} passed validations and {n} tokenized chunks "
                                f"used within {days:g} days"))
    leftovers = [p for folder in (cache.root, chunks) if folder.is_dir()
                 for p in folder.iterdir() if p.name.startswith(".") and _old(p, 1, now)]
    return out + [Found(kind="trash", target=str(p), delete=True, bytes=tree_bytes(p),
                        reason="left by a write or deletion stopped midway, a day ago or more")
                  for p in sorted(leftovers)]


def plan_gc(cfg: PipelineConfig, keep_runs: int | None = None,
            now: float | None = None) -> GcPlan:
    """What gc would delete and keep, and why (deletes nothing). ``keep_runs`` overrides
    tracking.gc_keep_runs."""
    uri = default_tracking_uri(cfg.tracking.tracking_uri)
    keep = cfg.tracking.gc_keep_runs if keep_runs is None else keep_runs
    if keep < 0:
        raise ValueError(f"keep {keep} finished runs? Give 0 or more")
    now = time.time() if now is None else now
    t = cfg.tracking
    needed = alias_runs(uri, (t.registered_policy, t.registered_reward_model))
    mlflow_runs, notes = deleted_run_items(uri, needed, t.gc_deleted_age_days, now)
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
    with one_gc_of(cfg) if delete else nullcontext():
        plan = plan_gc(cfg)
        for item in plan.kept:
            print(f"gc: kept {item.line()}")
        for note in plan.notes:
            print(f"gc: {note}")
        return GcResult(plan=plan, deleted=apply_gc(cfg, plan) if delete else [])


def apply_gc(cfg: PipelineConfig, plan: GcPlan) -> list[Found]:
    """Delete what ``plan`` marks for deletion, one log line each -> what went."""
    pause_point("gc:delete")
    done = []
    for item in plan.deletions:
        if item.kind == "mlflow run":
            continue
        path = Path(item.target)
        if not path.exists() and not path.is_symlink():
            continue  # gone meanwhile (another gc)
        if item.kind == "leftover":
            if not _sweep(cfg, path):
                continue
        else:
            if item.kind == "pull record":
                mark_pulled_all(plan.tracking_uri, cfg.tracking.experiment, path.name,
                                item.pairs)
            remove_tree(path, f"gc:{item.kind.replace(' ', '_')}")
        print(f"gc: deleted {item.line()}")
        done.append(item)
    return done + purge(plan.tracking_uri, [f for f in plan.deletions
                                            if f.kind == "mlflow run"])


def _sweep(cfg: PipelineConfig, path: Path) -> bool:
    """Delete a leftover under its run folder's owner lock -> False when a process took the
    folder since the plan."""
    root = Path(cfg.tracking.workdir)
    folder = root / path.relative_to(root).parts[0]
    if owner_lock_kept(folder):
        with unowned(folder) as free:
            if not free:
                print(f"gc: kept {path}: a process owns its run folder again")
                return False
            _remove_leftover(path)
        return True
    _remove_leftover(path)
    return True


def _remove_leftover(path: Path) -> None:
    """Deleted in place (not renamed): a leftover cut short is still one."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
