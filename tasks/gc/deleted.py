"""`rlhf gc`'s runs marked deleted in MLflow: purged with the runs under them only
``tracking.gc_deleted_age_days`` after deletion (so the UI can still restore a mistake), and
never while a registry alias needs them."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

from tasks.gc.items import DAY_S, Found
from tasks.gc.store import (
    StoredRun,
    deleted_experiments,
    deleted_runs,
    purge_runs,
    stage_runs,
)
from tasks.pipeline.retention import tree_bytes

AGE_KEY = "tracking.gc_deleted_age_days"


def artifact_bytes(artifact_uri: str | None) -> int:
    """Bytes under a run's local artifact folder (0 for artifacts elsewhere)."""
    if not artifact_uri or not artifact_uri.startswith(("file://", "/")):
        return 0
    return tree_bytes(Path(unquote(urlparse(artifact_uri).path)))


def _when(run: StoredRun, now: float) -> tuple[float | None, str]:
    """Days since ``run`` was deleted (None: the store did not record it), in words."""
    if run.deleted_time is None:
        return None, "at a time the store did not record"
    days = max(0.0, now - run.deleted_time / 1000) / DAY_S
    return days, f"{days:.1f} days ago"


def _item(top: StoredRun, under: list[StoredRun], needed: dict[str, str], age_days: float,
          now: float) -> Found:
    """One deleted run with the runs under it, kept or purged."""
    group = [top, *under]
    size = sum(artifact_bytes(r.artifact_uri) for r in group)
    need = next((needed[r] for r in [top.parent_run_id, *(g.run_id for g in group)]
                 if r in needed), None)
    days, when = _when(top, now)
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


def deleted_run_items(uri: str, needed: dict[str, str], age_days: float,
                      now: float) -> tuple[list[Found], list[str]]:
    """One item per topmost deleted run, and notes on what gc cannot do."""
    runs = deleted_runs(uri)
    if not runs:
        return [], []
    ids = {r.run_id for r in runs}
    tops = [r for r in runs if r.parent_run_id not in ids]
    under = stage_runs(uri, [r.run_id for r in tops])
    out = [_item(top, under[top.run_id], needed, age_days, now) for top in tops]
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
        notes.append(f"`mlflow gc` also removes the experiments marked deleted: "
                     f"{', '.join(gone)}")
    return out, notes


def purge(uri: str, items: list[Found]) -> list[Found]:
    """Purge the deleted runs of ``items`` with the runs under them -> the items purged."""
    if items:
        purge_runs(uri, [i for f in items for i in (f.target, *f.runs)])
    for item in items:
        print(f"gc: deleted {item.line()}")
    return items
