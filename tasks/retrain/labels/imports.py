"""Labels back in: a labelled file (`rlhf label import FILE`, or dropped into
``retrain.watch_dir``) becomes a preference batch in the watch folder, or is quarantined.

Every row must name a collected pair, else the whole file is refused before any training.
Labellers failing the known-answer checks are held back, the rest majority-voted; a batch of
too low quality (``collect.quality``) is quarantined so later rounds go on without it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
from prefect import task

from data_checks import labels
from data_checks.labels import LabelFigures
from data_checks.loading import DataError
from tasks.config.pipeline_config import PipelineConfig
from tasks.platform.mlflow.addresses import default_tracking_uri
from tasks.platform.mlflow.runs import tracking_client
from tasks.platform.mlflow.tags import (
    LABELS_BATCH_TAG,
    LABELS_COLLECTIONS_TAG,
    LABELS_DECISION_TAG,
    LABELS_FILE_TAG,
    LABELS_HELD_BACK_TAG,
    LABELS_PREFERENCE_DIGEST_TAG,
    LABELS_REASON_TAG,
)
from tasks.platform.prefect.events import (
    IMPORTED_BY_LABEL,
    LABELLED,
    LABELS_FILE_LABEL,
    OUTCOME_LABEL,
    PREFERENCES_RESOURCE,
    QUARANTINED,
    emit,
)
from tasks.platform.prefect.prefect_api import report
from tasks.retrain.batches import BATCH_SUFFIXES, file_digest
from tasks.retrain.labels.collect import experiment_for
from tasks.retrain.records import Batch, LabelImport
from tasks.retrain.store import collection_records, record_label_import, usual_rate

IMPORTED, QUARANTINE = "imported", "quarantine"


def quarantine(path: Path, watch_dir: Path, reason: str) -> tuple[Path, str]:
    """A refused file into ``<watch_dir>/quarantine/`` with a note -> (where, a sentence):
    moved from the watch folder, else copied (the user's original stays)."""
    folder = watch_dir / QUARANTINE
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / path.name
    if path.parent == watch_dir:
        shutil.move(str(path), target)
        where = f"moved to {target}"
    else:
        shutil.copy2(path, target)
        where = f"copied to {target} (the original {path} stays where it was)"
    target.with_name(target.name + ".why.txt").write_text(reason + "\n")
    return target, where


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _figures_text(figures: LabelFigures, counts: dict, rows: int) -> str:
    per = ", ".join(f"{lab.name} {_f(lab.known_agreement)} on {lab.known_labelled}"
                    for lab in figures.labellers)
    held = "; ".join(f"{name} ({why})" for name, why in figures.held_back.items())
    return (f"{rows} label rows: {counts['pairs']} preference pairs, {counts['ties']} ties "
            f"and {counts['skips']} skips dropped, {counts['known']} known-answer pairs held "
            f"out; agreement with the known answers {_f(figures.known_agreement)} on "
            f"{figures.known_labelled} pairs (per labeller: {per or 'none'}); labellers "
            f"held back, votes dropped: {held or 'none'}; skip rate {figures.skip_rate:.2f}; "
            f"with the policy's reward model {_f(figures.rm_agreement)} on {figures.rm_pairs} "
            f"pairs; between labellers {_f(figures.agreement_rate)} (kappa "
            f"{_f(figures.kappa)})")


def _log_import(cfg: PipelineConfig, path: Path, digest: str, figures: LabelFigures,
                counts: dict, tags: dict, outcome: str) -> str:
    client = tracking_client(default_tracking_uri(cfg.tracking.tracking_uri))
    tags = {LABELS_BATCH_TAG: digest, LABELS_FILE_TAG: path.name,
            LABELS_HELD_BACK_TAG: json.dumps(figures.held_back), **tags}
    metrics = {f"labels/{k}": float(v) for k, v in counts.items()}
    return record_label_import(client, experiment_for(client, cfg),
                               f"labels-{outcome}-{digest[:8]}", tags,
                               {**metrics, **figures.metrics()}, path)


def decide(cfg: PipelineConfig, path: Path) -> dict:
    """Check a labelled file, judge labellers, vote -> pairs, counts, figures, refusal."""
    df = labels.read_labelled(path)
    client = tracking_client(default_tracking_uri(cfg.tracking.tracking_uri))
    ids = [str(i).strip() for i in df["id"].tolist()]
    exp_id = experiment_for(client, cfg)
    records = collection_records(client, exp_id, ids)
    rows = labels.check_rows(df, path, set(records))
    q = cfg.collect.quality
    labellers = labels.judge_labellers(rows, labels.known_answers(records), q.rules())
    kept = labels.kept_rows(rows, labellers)
    decided = labels.majority(kept)
    used = {pid: records[pid] for pid in decided}
    figures = labels.label_figures(rows, kept, decided, used, labellers)
    pairs, counts = labels.preference_rows(decided, used)
    refusal = labels.quality_refusal(
        figures, q.rules(), usual_rate(client, exp_id, "labels/rm_agreement"), q.max_rm_drop,
        usual_rate(client, exp_id, "labels/skip_rate"), q.max_skip_rise)
    if refusal is None and not pairs:
        refusal = "no pair was labelled a or b: nothing to train on"
    return {"pairs": pairs, "counts": counts, "figures": figures, "refusal": refusal,
            "rows": len(rows), "collections": sorted({p.rsplit("-", 1)[0] for p in ids
                                                      if p in records})}


@task(name="import_labels")
def import_labels(cfg: PipelineConfig, path: str, imported_by: str = "import",
                  run_tags: dict[str, str] | None = None) -> LabelImport:
    """Import one labelled file as a preference batch in the watch folder, or quarantine it
    when label quality is too low; DataError when rows are malformed."""
    src, watch = Path(path).resolve(), Path(cfg.retrain.watch_dir).resolve()
    digest = file_digest(src)
    # the batch an earlier import of the same file wrote: labelled-<its digest>-from-<digest>
    done = sorted(watch.glob(f"labelled-*-from-{digest}.jsonl")) if watch.is_dir() else []
    if done:
        return LabelImport(status="already imported", file=src.name, batch=str(done[0]))
    try:
        d = decide(cfg, src)
    except DataError as err:
        emit(QUARANTINED, PREFERENCES_RESOURCE + digest, src.name,
             {LABELS_FILE_LABEL: src.name, OUTCOME_LABEL: "refused"}, {"reason": str(err)})
        raise
    figures: LabelFigures = d["figures"]
    text = _figures_text(figures, d["counts"], d["rows"])
    tags = {LABELS_COLLECTIONS_TAG: json.dumps(d["collections"]),
            LABELS_DECISION_TAG: "quarantined" if d["refusal"] else "accepted",
            LABELS_REASON_TAG: d["refusal"] or "label quality passed", **(run_tags or {})}
    if d["refusal"]:
        moved, where = quarantine(src, watch, f"{src.name}: quarantined: {d['refusal']} "
                                  f"({text})")
        run_id = _log_import(cfg, moved, digest, figures, d["counts"], tags, "quarantined")
        report("rlhf-labels", f"# Labels quarantined: {src.name}\n\n{d['refusal']}.\n\n{text}."
               f"\n\n{where[0].upper()}{where[1:]}; nothing trains on it.\n", "label import")
        emit(QUARANTINED, PREFERENCES_RESOURCE + digest, src.name,
             {IMPORTED_BY_LABEL: imported_by, LABELS_FILE_LABEL: src.name,
              OUTCOME_LABEL: "quarantined"},
             {"reason": d["refusal"], "figures": figures.metrics(),
              "held_back": figures.held_back, "mlflow_run_id": run_id})
        return LabelImport(status="quarantined", file=src.name, reason=d["refusal"],
                           text=text, moved_to=str(moved), where=where, run_id=run_id,
                           held_back=figures.held_back)
    watch.mkdir(parents=True, exist_ok=True)
    tmp = watch / f".{digest}.jsonl.part"  # named by its digest once written
    pd.DataFrame(d["pairs"]).to_json(tmp, orient="records", lines=True, force_ascii=False)
    batch_digest = file_digest(tmp)
    # the lineage's digest first, so a person matches them by eye
    target = watch / f"labelled-{batch_digest}-from-{digest}.jsonl"
    tmp.rename(target)
    run_id = _log_import(cfg, src, digest, figures, d["counts"],
                         {**tags, LABELS_PREFERENCE_DIGEST_TAG: batch_digest}, "accepted")
    if src.parent == watch:  # a dropped file: its pairs are the batch now
        (watch / IMPORTED).mkdir(exist_ok=True)
        shutil.move(str(src), watch / IMPORTED / src.name)
    report("rlhf-labels", f"# Labels imported: {src.name}\n\n{text}.\n\nPreference batch "
           f"`{target.name}` (digest {batch_digest}) waits for the next retrain.\n",
           "label import")
    emit(LABELLED, PREFERENCES_RESOURCE + batch_digest, target.name,
         {IMPORTED_BY_LABEL: imported_by, LABELS_FILE_LABEL: src.name},
         {"pairs": d["counts"]["pairs"], "figures": figures.metrics(),
          "held_back": figures.held_back, "mlflow_run_id": run_id})
    return LabelImport(status="imported", file=src.name, batch=str(target), text=text,
                       digest=batch_digest, run_id=run_id, counts=d["counts"],
                       held_back=figures.held_back)


@task(name="import_dropped")
def import_dropped(cfg: PipelineConfig) -> list[LabelImport]:
    """Import every labelled file in the watch folder; a malformed one is quarantined, so
    later rounds go on."""
    watch = Path(cfg.retrain.watch_dir)
    files = sorted(p for p in watch.glob("*") if p.suffix in BATCH_SUFFIXES
                   and labels.is_labelled(p)) if watch.is_dir() else []
    out = []
    for path in files:
        try:
            out.append(import_labels.fn(cfg, str(path), "retrain"))
        except DataError as err:  # import_labels sent the quarantined event
            moved, where = quarantine(path.resolve(), watch.resolve(),
                                      f"{path.name}: refused: {err}")
            report("rlhf-labels", f"# Labels refused: {path.name}\n\n{err}\n\n"
                   f"{where[0].upper()}{where[1:]}; nothing trains on it.\n", "label import")
            out.append(LabelImport(status="refused", file=path.name, reason=str(err),
                                   moved_to=str(moved), where=where))
    return out


def quarantine_batches(cfg: PipelineConfig, batches: list[Batch], reason: str) -> list[str]:
    """Quarantine the batches the data gate refused, so the next round goes on -> where."""
    watch, moved = Path(cfg.retrain.watch_dir).resolve(), []
    for b in batches:
        if not b.path or not Path(b.path).exists():
            continue
        why = f"refused by the data gate: {reason}"
        moved.append(str(quarantine(Path(b.path), watch, f"{b.name}: {why}")[0]))
        emit(QUARANTINED, PREFERENCES_RESOURCE + b.digest, b.name,
             {OUTCOME_LABEL: "refused"}, {"reason": why})
    return moved
