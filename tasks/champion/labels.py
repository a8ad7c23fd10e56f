"""Labels back in: a labelled file (from `rlhf label import FILE`, or dropped into
``retrain.watch_dir``) becomes a preference batch in the watch folder, or is quarantined.

Each row must name a pair a collection wrote (its record in MLflow gives the texts, the
policy's reward-model scores and the known answers) and a choice among a / b / tie / skip;
anything else refuses the whole file, naming file and rows, before any training. Majority
vote per pair; ties, skips and the known-answer pairs never train. A batch whose labels
agree too rarely with the known answers or with the policy's reward model
(``collect.quality``) is moved to ``<watch_dir>/quarantine/`` with a note saying why, and the
next rounds go on without it. Every import is an MLflow run (tag ``rlhf.labels.batch``) and,
when accepted, a ``rlhf.preferences.labelled`` event.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd
from prefect import task

from data_checks.labels import (
    check_rows,
    is_labelled,
    label_figures,
    majority,
    preference_rows,
    quality_refusal,
    read_labelled,
)
from data_checks.loading import DataError
from tasks.champion.batches import BATCH_SUFFIXES, file_digest, report
from tasks.champion.collect import RECORD, experiment_for
from tasks.champion.events import (
    IMPORTED_BY_LABEL,
    LABELLED,
    LABELS_FILE_LABEL,
    PREFERENCES_RESOURCE,
    emit,
)
from tasks.config import PipelineConfig
from tasks.tracking.runs import default_tracking_uri, log_metrics, tracking_client
from tasks.tracking.tags import (
    COLLECTION_TAG,
    LABELS_BATCH_TAG,
    LABELS_COLLECTIONS_TAG,
    LABELS_DECISION_TAG,
    LABELS_FILE_TAG,
    LABELS_PREFERENCE_DIGEST_TAG,
    LABELS_REASON_TAG,
)

IMPORTED, QUARANTINE = "imported", "quarantine"


def collection_records(client, experiment_id: str, ids: list[str]) -> dict[str, dict]:
    """The records of the collections the ids name (``<collection>-<nnnn>``) -> {id: pair}."""
    records = {}
    for cid in sorted({i.rsplit("-", 1)[0] for i in ids if "-" in i}):
        runs = client.search_runs([experiment_id], max_results=1, filter_string=(
            f"tags.`{COLLECTION_TAG}` = '{cid}' and attributes.status = 'FINISHED'"))
        if runs:
            path = client.download_artifacts(runs[0].info.run_id, RECORD)
            records.update({r["id"]: r for r in json.loads(Path(path).read_text())})
    return records


def usual_rm_agreement(client, experiment_id: str, last: int = 5) -> float | None:
    """Median reward-model agreement of the last accepted imports (None: none yet)."""
    runs = client.search_runs([experiment_id], max_results=last, order_by=[
        "attributes.start_time DESC"], filter_string=f"tags.`{LABELS_DECISION_TAG}` = 'accepted'")
    rates = sorted(r.data.metrics["labels/rm_agreement"] for r in runs
                   if "labels/rm_agreement" in r.data.metrics)
    return rates[len(rates) // 2] if rates else None


def quarantine(path: Path, watch_dir: Path, reason: str) -> Path:
    """A refused file into ``<watch_dir>/quarantine/`` with a note: moved out of the watch
    folder, copied from anywhere else (the user's file stays where it was)."""
    folder = watch_dir / QUARANTINE
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / path.name
    if path.parent == watch_dir:
        shutil.move(str(path), target)
    else:
        shutil.copy2(path, target)
    target.with_name(target.name + ".why.txt").write_text(reason + "\n")
    return target


def batch_path(watch_dir: Path, digest: str) -> Path:
    """Where the preference batch of a labelled file (by its digest) is written."""
    return watch_dir / f"labelled-{digest}.jsonl"


def _figures_text(figures: dict, counts: dict, rows: int) -> str:
    def f(x):
        return "n/a" if x is None else f"{x:.2f}"

    per = ", ".join(f"{k} {f(v)}" for k, v in figures["labeller_known_agreement"].items())
    return (f"{rows} label rows: {counts['pairs']} preference pairs, {counts['ties']} ties "
            f"and {counts['skips']} skips dropped, {counts['known']} known-answer pairs held "
            f"out; agreement with the known answers {f(figures['known_agreement'])} on "
            f"{figures['known_labelled']} pairs (per labeller: {per or 'none'}); with the "
            f"policy's reward model {f(figures['rm_agreement'])} on {figures['rm_pairs']} "
            f"pairs; between labellers {f(figures['agreement_rate'])}")


def _log_import(cfg: PipelineConfig, path: Path, digest: str, figures: dict, counts: dict,
                tags: dict) -> str:
    client = tracking_client(default_tracking_uri(cfg.tracking.tracking_uri))
    run = client.create_run(experiment_for(client, cfg), run_name=f"labels-{digest[:8]}",
                            tags={LABELS_BATCH_TAG: digest, LABELS_FILE_TAG: path.name, **tags})
    metrics = {f"labels/{k}": v for k, v in {**counts, **figures}.items()
               if isinstance(v, int | float) and v is not None}
    metrics.update({f"labels/known_agreement/{metric_safe(k)}": v for k, v in
                    figures["labeller_known_agreement"].items() if v is not None})
    log_metrics(client, run.info.run_id, metrics, 0)
    client.log_artifact(run.info.run_id, str(path), "labels")
    client.set_terminated(run.info.run_id, status="FINISHED")
    return run.info.run_id


def metric_safe(name: str) -> str:
    """A labeller's name as MLflow takes it in a metric key (an email's ``@`` -> ``_``)."""
    return re.sub(r"[^\w\-. :/]", "_", name)


def decide(cfg: PipelineConfig, path: Path) -> dict:
    """Read and check a labelled file, vote, measure -> pairs, counts, figures, refusal."""
    df = read_labelled(path)
    client = tracking_client(default_tracking_uri(cfg.tracking.tracking_uri))
    ids = [str(i).strip() for i in df["id"].tolist()]
    exp_id = experiment_for(client, cfg)
    records = collection_records(client, exp_id, ids)
    rows = check_rows(df, path, set(records))
    decided = majority(rows)
    used = {pid: records[pid] for pid in decided}
    figures = label_figures(rows, decided, used)
    pairs, counts = preference_rows(decided, used)
    q = cfg.collect.quality
    refusal = quality_refusal(figures, q.min_known_agreement, q.min_known_labelled,
                              usual_rm_agreement(client, exp_id),
                              q.max_rm_drop)
    if refusal is None and not pairs:
        refusal = "no pair was labelled a or b: nothing to train on"
    return {"pairs": pairs, "counts": counts, "figures": figures, "refusal": refusal,
            "rows": len(rows), "collections": sorted({p.rsplit("-", 1)[0] for p in decided})}


@task(name="import_labels")
def import_labels(cfg: PipelineConfig, path: str, imported_by: str = "import") -> dict:
    """One labelled file -> a preference batch in the watch folder (accepted) or the file in
    ``quarantine/`` (label quality too low); DataError (file and rows named) when rows are
    malformed. ``imported_by``: ``import`` (CLI) or ``retrain`` (a dropped file)."""
    src, watch = Path(path).resolve(), Path(cfg.retrain.watch_dir).resolve()
    digest = file_digest(src)
    target = batch_path(watch, digest)
    if target.exists():
        return {"status": "already imported", "file": src.name, "batch": str(target)}
    d = decide(cfg, src)
    text = _figures_text(d["figures"], d["counts"], d["rows"])
    tags = {LABELS_COLLECTIONS_TAG: json.dumps(d["collections"]),
            LABELS_DECISION_TAG: "quarantined" if d["refusal"] else "accepted",
            LABELS_REASON_TAG: d["refusal"] or "label quality passed"}
    if d["refusal"]:
        moved = quarantine(src, watch, f"{src.name}: quarantined: {d['refusal']} ({text})")
        run_id = _log_import(cfg, moved, digest, d["figures"], d["counts"], tags)
        report("rlhf-labels", f"# Labels quarantined: {src.name}\n\n{d['refusal']}.\n\n{text}."
               f"\n\nMoved to `{moved}`; nothing trains on it.\n", "label import")
        return {"status": "quarantined", "file": src.name, "reason": d["refusal"],
                "text": text, "moved_to": str(moved), "run_id": run_id}
    watch.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(d["pairs"]).to_json(target, orient="records", lines=True, force_ascii=False)
    batch_digest = file_digest(target)
    run_id = _log_import(cfg, src, digest, d["figures"], d["counts"],
                         {**tags, LABELS_PREFERENCE_DIGEST_TAG: batch_digest})
    if src.parent == watch:  # a dropped file: its pairs are the batch now
        (watch / IMPORTED).mkdir(exist_ok=True)
        shutil.move(str(src), watch / IMPORTED / src.name)
    report("rlhf-labels", f"# Labels imported: {src.name}\n\n{text}.\n\nPreference batch "
           f"`{target.name}` (digest {batch_digest}) waits for the next retrain.\n",
           "label import")
    emit(LABELLED, PREFERENCES_RESOURCE + batch_digest, target.name,
         {IMPORTED_BY_LABEL: imported_by, LABELS_FILE_LABEL: src.name},
         {"pairs": d["counts"]["pairs"], "figures": d["figures"], "mlflow_run_id": run_id})
    return {"status": "imported", "file": src.name, "batch": str(target), "text": text,
            "digest": batch_digest, "run_id": run_id, "counts": d["counts"]}


@task(name="import_dropped")
def import_dropped(cfg: PipelineConfig) -> list[dict]:
    """Every labelled file in the watch folder imported (a retrain's first step); a file
    with malformed rows is quarantined with the error, so later rounds go on."""
    watch = Path(cfg.retrain.watch_dir)
    files = sorted(p for p in watch.glob("*") if p.suffix in BATCH_SUFFIXES
                   and is_labelled(p)) if watch.is_dir() else []
    out = []
    for path in files:
        try:
            out.append(import_labels.fn(cfg, str(path), "retrain"))
        except DataError as err:
            moved = quarantine(path.resolve(), watch.resolve(), f"{path.name}: refused: {err}")
            report("rlhf-labels", f"# Labels refused: {path.name}\n\n{err}\n\nMoved to "
                   f"`{moved}`; nothing trains on it.\n", "label import")
            out.append({"status": "refused", "file": path.name, "reason": str(err),
                        "moved_to": str(moved)})
    return out


def quarantine_batches(cfg: PipelineConfig, batches: list[dict], reason: str) -> list[str]:
    """A round's new batches that the data gate refused, out of the watch folder (so the
    next round goes on with later batches) -> where they went."""
    watch = Path(cfg.retrain.watch_dir).resolve()
    return [str(quarantine(Path(b["path"]), watch, f"{b['name']}: refused by the data gate: "
                           f"{reason}")) for b in batches if Path(b["path"]).exists()]
