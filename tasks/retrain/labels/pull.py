"""`rlhf label pull`: a collection's finished Label Studio annotations become the same batch
a labelled file makes (``import_labels``).

Exactly once per pair: a pull writes its rows to ``pulls/<collection>/pending/`` before
importing and moves them to ``done/`` after, so a stopped pull is finished by the next; later
annotations on a pulled pair are only counted. A batch waits for
``collect.destination.min_labelled`` of the tasks unless ``partial``.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from tasks.config.pipeline_config import PipelineConfig
from tasks.platform.files import read_jsonl
from tasks.platform.mlflow.addresses import default_tracking_uri
from tasks.platform.mlflow.runs import tracking_client
from tasks.platform.mlflow.tags import (
    COLLECTION_LABEL_STUDIO_TAG,
    COLLECTION_TAG,
    LABELS_SOURCE_TAG,
    PULLED_ALL_TAG,
)
from tasks.retrain.labels import studio
from tasks.retrain.labels.client import LabelStudio, LabelStudioError, NotFound
from tasks.retrain.labels.collect import experiment_for
from tasks.retrain.labels.imports import import_labels
from tasks.retrain.records import LabelImport
from tasks.retrain.store import find_collection, studio_collections

SOURCE = "label-studio"


@dataclass(frozen=True)
class PullResult:
    """What one pull of one collection did."""

    collection: str
    status: str  # imported | quarantined | already imported | waiting | nothing new | done
    labelled: int  # pairs labelled, this pull's and earlier pulls'
    total: int
    new_pairs: int = 0
    late: int = 0  # annotations on pairs pulled before: not imported
    refused: tuple[str, ...] = ()
    file: str | None = None
    imported: LabelImport | None = None  # what the import did
    page: str = ""

    def text(self) -> str:
        share = f"{self.labelled} of {self.total} pairs labelled"
        lines = [f"collection {self.collection} ({self.page}): {share}"]
        if self.status == "waiting":
            lines.append("waiting: a batch is made once collect.destination.min_labelled of "
                         "the tasks are labelled; `rlhf label pull --partial` makes one now")
        elif self.status == "nothing new":
            lines.append("nothing new to import")
        elif self.status == "done":
            lines.append("every pair was pulled before")
        else:
            lines.append(f"pulled {self.new_pairs} newly labelled pairs into {self.file}: "
                         f"{self.status}")
            held = self.imported.held_back if self.imported else {}
            lines += [f"held back, votes dropped: {who} ({why})" for who, why in held.items()]
        if self.late:
            lines.append(f"{self.late} annotation(s) on pairs pulled before were not "
                         "imported (a pair is imported once)")
        lines += [f"left out: {r}" for r in self.refused]
        return "\n".join(lines)


def _pulled(folder: Path) -> dict[str, list[dict]]:
    """Pair id -> the vote rows it was pulled with (done and pending pulls)."""
    out: dict[str, list[dict]] = {}
    for path in sorted(folder.glob("*/*.jsonl")):
        for row in read_jsonl(path):  # lines end at "\n" only: a name may hold U+2028
            out.setdefault(row["id"], []).append(row)
    return out


def _import(cfg: PipelineConfig, pending: Path) -> LabelImport:
    """Import a pending pull file (idempotent), then move it to ``done/``."""
    out = import_labels.fn(cfg, str(pending), "import", {LABELS_SOURCE_TAG: SOURCE})
    done = pending.parent.parent / "done" / pending.name
    done.parent.mkdir(parents=True, exist_ok=True)
    os.replace(pending, done)
    return out


def _votes(link: studio.StudioLink, tasks: dict, pulled: dict[str, list[dict]]
           ) -> tuple[dict[str, list[dict]], list[str], int]:
    """(new vote rows by unpulled pair, rows left out, late annotations on pulled pairs)."""
    new: dict[str, list[dict]] = {}
    refused: list[str] = []
    late = 0
    for task_id, pair_id in sorted(link.tasks.items()):
        if task_id not in tasks:
            continue
        data, votes = tasks[task_id]
        if pair_id in pulled:
            seen = {(r["annotation_id"], r["updated_at"]) for r in pulled[pair_id]}
            late += sum((v.annotation_id, v.updated_at) not in seen for v in votes)
            continue
        shown = link.shown[pair_id]
        if any(data.get(k) != shown.get(k) for k in ("prompt", "response_a", "response_b")):
            refused.append(f"task {task_id}: its texts were edited in Label Studio, so its "
                           "votes are not used (the texts that train come from the "
                           "collection's record)")
            continue
        for v in votes:
            choice = "skip" if v.choice == "skip" else studio.CHOICE_OF.get(v.choice)
            if choice is None:
                refused.append(f"task {task_id}, annotation {v.annotation_id} by "
                               f"{v.labeller}: answer '{v.choice}' is not one of "
                               f"{', '.join(studio.CHOICE_OF)}")
                continue
            new.setdefault(pair_id, []).append({
                "id": pair_id, "choice": choice, "labeller": v.labeller, "task_id": task_id,
                "annotation_id": v.annotation_id, "updated_at": v.updated_at})
    return new, refused, late


def pull_collection(cfg: PipelineConfig, client, run, partial: bool = False) -> PullResult:
    """One pull of one collection (see the module's docstring)."""
    cid = run.data.tags[COLLECTION_TAG]
    if PULLED_ALL_TAG in run.data.tags:  # every pair pulled; `rlhf gc` deleted its record
        pairs = int(run.data.tags[PULLED_ALL_TAG])
        return PullResult(cid, "done", pairs, pairs,
                          page=run.data.tags.get(COLLECTION_LABEL_STUDIO_TAG, ""))
    link = studio.read_link(client, run)
    folder = Path(cfg.collect.out_dir) / "pulls" / cid
    for pending in sorted((folder / "pending").glob("*.jsonl")):
        _import(cfg, pending)  # a pull stopped midway: finish it first
    pulled = _pulled(folder)
    total = len(link.tasks)
    if len(pulled) >= total:
        return PullResult(cid, "done", len(pulled), total, page=link.page)
    ls = LabelStudio.from_env(link.url)  # LABEL_STUDIO_URL first
    try:
        ls.get(f"/api/projects/{link.project_id}/", what="read the project")
    except NotFound:
        raise LabelStudioError(
            f"collection {cid}: its Label Studio project {link.project_id} "
            f"('{link.project_title}') at {ls.url} no longer exists; its pairs are still in "
            f"the collection's labelling file (`rlhf runs` shows its run): label them there "
            "and run `rlhf label import FILE`") from None
    new, refused, late = _votes(link, studio.read_tasks(ls, link.project_id), pulled)
    need = cfg.collect.destination.annotations_per_task
    ready = {p: rows for p, rows in new.items() if len(rows) >= need}
    labelled = len(pulled) + len(ready)
    common = dict(collection=cid, labelled=labelled, total=total, late=late,
                  refused=tuple(refused), page=link.page)
    if not ready:
        return PullResult(status="nothing new", **common)
    if labelled / total < cfg.collect.destination.min_labelled and not partial:
        return PullResult(status="waiting", **common)
    rows = [r for p in sorted(ready) for r in ready[p]]
    digest = hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:12]
    pending = folder / "pending" / f"{cid}-pull-{digest}.jsonl"
    pending.parent.mkdir(parents=True, exist_ok=True)
    tmp = pending.with_name(pending.name + ".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                   encoding="utf-8")
    os.replace(tmp, pending)
    out = _import(cfg, pending)
    # the import's verdict in the project's description, where the labellers see it (the
    # open-source edition has no comments API); best effort
    held = "; ".join(f"{who}: {why}" for who, why in out.held_back.items())
    text = f"RLHF pipeline, last pull: {out.status}. Labellers held back, their votes " \
        f"dropped: {held or 'none'}. {out.text or out.reason or out.status}"
    try:
        ls.call("PATCH", f"/api/projects/{link.project_id}/", {"description": text[:5000]},
                what="change the project's description")
    except LabelStudioError as err:
        print(f"note: the verdict was not written to the project ({err})")
    return PullResult(status=out.status, new_pairs=len(ready),
                      file=str(folder / "done" / pending.name), imported=out, **common)


def pulled_in_full(cfg: PipelineConfig) -> list[tuple[str, Path, int]]:
    """(id, ``pulls/`` folder, pairs) of collections fully pulled with none pending, whose
    records `rlhf gc` may delete once it sets :data:`PULLED_ALL_TAG`."""
    root = Path(cfg.collect.out_dir) / "pulls"
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) \
        if root.is_dir() else []
    if not folders:
        return []
    client = tracking_client(default_tracking_uri(cfg.tracking.tracking_uri))
    exp_id = experiment_for(client, cfg)
    out = []
    for folder in folders:
        if list((folder / "pending").glob("*.jsonl")):
            continue  # a pull stopped midway: the next pull finishes it
        run = find_collection(client, exp_id, folder.name)
        if run is None or COLLECTION_LABEL_STUDIO_TAG not in run.data.tags:
            continue
        total = len(studio.read_link(client, run).tasks)
        if len(_pulled(folder)) >= total:
            out.append((folder.name, folder, total))
    return out


def pull(cfg: PipelineConfig, collection: str | None = None,
         partial: bool = False) -> list[PullResult]:
    """Pull one collection, or every Label Studio collection with pairs left to pull."""
    client = tracking_client(default_tracking_uri(cfg.tracking.tracking_uri))
    exp_id = experiment_for(client, cfg)
    runs = [find_collection(client, exp_id, collection)] if collection is not None else \
        studio_collections(client, exp_id)
    if None in runs:
        raise LabelStudioError(f"no finished collection '{collection}' in this MLflow "
                               "experiment (`rlhf runs` lists runs; collection ids look like "
                               "v3-1a2b3c4d)")
    return [pull_collection(cfg, client, run, partial) for run in runs]
