"""Preference batches: finding new ones in the watch folder by digest, writing a round's
preference file from them, and recording them consumed in MLflow."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

import pandas as pd
from prefect import task

from data_checks.config import DataSource
from data_checks.files import write_cleaned
from data_checks.loading import DataError, iter_table, load_table
from tasks.config.pipeline_config import PipelineConfig
from tasks.pipeline.prepare import Prepared
from tasks.platform.mlflow.artifacts import TableInput, log_table_inputs
from tasks.platform.mlflow.runs import RunContext, tag_parent
from tasks.platform.mlflow.tags import (
    BATCH_SOURCES_TAG,
    RETRAIN_BATCHES_TAG,
    RETRAIN_TAG,
    TRAINED_ON_TAG,
)
from tasks.retrain.gate.champion import Champion
from tasks.retrain.gate.prompts import check_retrainable
from tasks.retrain.records import Batch, Batches
from tasks.retrain.store import batch_sources, consumed_batches, consumed_copy, record_consumed

BATCH_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")


def file_digest(path: Path) -> str:
    """Identity of a batch: sha256 of its bytes (16 hex digits), whatever its name."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


@task(name="find_batches")
def find_batches(cfg: PipelineConfig) -> Batches:
    """Find the watch folder's new batch files (in name order) and every consumed batch in the
    order consumed, so each round's preference file begins with the last round's."""
    folder = Path(cfg.retrain.watch_dir)
    files = sorted(p for p in folder.glob("*") if p.suffix in BATCH_SUFFIXES) \
        if folder.is_dir() else []
    done = consumed_batches(cfg)  # in the order consumed
    new: list[Batch] = []
    present: dict[str, Batch] = {}
    for path in files:
        batch = Batch(name=path.name, path=str(path.resolve()), digest=file_digest(path))
        if batch.digest not in done:
            new.append(batch)
        elif batch.digest not in present:
            present[batch.digest] = batch.model_copy(update={"run_id": done[batch.digest]})
    consumed = [present.get(d) or Batch(name=f"consumed-{d}", digest=d, run_id=run)
                for d, run in done.items()]
    return Batches(new=new, consumed=consumed)


COMBINE_ROWS = 25_000  # rows of the configured pairs read and written at a time


def _pair_keys(frame: pd.DataFrame) -> list[str]:
    """One key per row: its prompt, chosen and rejected answer (text or messages)."""
    return [json.dumps(row, sort_keys=True, ensure_ascii=False)
            for row in zip(frame["prompt"], frame["chosen"], frame["rejected"])]


def write_round_pairs(path: Path, configured: DataSource | None,
                      batches: Iterable[tuple[str, pd.DataFrame]]) -> list[dict]:
    """Write the ``configured`` pairs chunk by chunk (flat memory), then each batch without the
    pairs written before it (a pair labelled again adds no label, and the gate refuses repeated
    rows) -> each batch's 1-based rows in the file, as the gate names them."""
    batches = [(name, frame, _pair_keys(frame)) for name, frame in batches]
    in_batches = {key for _, _, keys in batches for key in keys}
    seen: set[str] = set()  # keys written so far (of the configured pairs: those in a batch)
    path.write_text("", encoding="utf-8")
    n = 0  # rows written so far
    if configured is not None:
        for chunk in iter_table(configured, "preference", COMBINE_ROWS):
            write_cleaned(chunk, path, append=True)
            n += len(chunk)
            if in_batches:
                seen.update(key for key in _pair_keys(chunk) if key in in_batches)
    rows = []
    for name, frame, keys in batches:
        new = []  # the batch's rows not written before (by an earlier batch or row)
        for key in keys:
            new.append(key not in seen)
            seen.add(key)
        if not all(new):
            print(f"batch {name}: {len(new) - sum(new)} of its pairs repeat a pair written "
                  "before it (the same prompt, chosen and rejected answer); left out")
            frame = frame[new]
        if len(frame):
            write_cleaned(frame, path, append=True)
            rows.append({"name": name, "first": n + 1, "last": n + len(frame)})
            n += len(frame)
    return rows


@task(name="add_batches")
def add_batches(ctx: RunContext, cfg: PipelineConfig, prep: Prepared, batches: list[Batch],
                champion: Champion | None = None,
                consumed: list[Batch] | None = None) -> Prepared:
    """Set the retrain's inputs: one preference file of the configured pairs and consumed
    batches (unless ``rm_data: new_only``) then the new ones, appended so the gate's cache
    reuses the last round's chunks; the champion is the base. An unreadable batch stops here."""
    data = prep.data
    check_retrainable(cfg, data)
    only_new = cfg.retrain.rm_data == "new_only" and champion is not None
    path = ctx.stage_dir("batches") / "preference.jsonl"
    used = []

    def frames():  # each batch from its file in the watch folder, else its run's copy
        for batch in [*([] if only_new else consumed or []), *batches]:
            path = Path(batch.path) if batch.path and Path(batch.path).is_file() else None
            if path is None and batch.run_id:
                path = consumed_copy(ctx, batch.run_id, batch.digest,
                                     ctx.stage_dir("batches") / "consumed")
            if path is None:
                print(f"consumed batch {batch.digest}: no file and no copy in MLflow; left out")
                continue
            try:
                frame = load_table(DataSource(path=str(path)), "preference")
            except DataError as err:
                raise DataError(f"preference batch {batch.name}: {err}") from None
            used.append(batch)
            yield batch.name, frame

    rows = write_round_pairs(path, None if only_new else data.preference, frames())
    trained_on = [b.digest for b in used]
    update = {"data": data.model_copy(update={"preference": DataSource(path=str(path))}),
              "batch_rows": rows, "trained_on": trained_on,
              "batch_sources": batch_sources(cfg, trained_on)}
    if champion is not None:
        update.update(base_model=champion.policy_dir, tokenizer=champion.policy_dir)
    out = prep.model_copy(update=update)
    tag_parent(ctx, {
        RETRAIN_TAG: "true", RETRAIN_BATCHES_TAG: json.dumps(
            [{"name": b.name, "digest": b.digest} for b in batches]),
        TRAINED_ON_TAG: json.dumps(out.trained_on),
        BATCH_SOURCES_TAG: json.dumps(out.batch_sources)})
    return out


@task(name="mark_consumed")
def mark_consumed(ctx: RunContext, batches: list[Batch]) -> None:
    """Record the batches as consumed (each an MLflow dataset input of the retrain run), with a
    copy of each file on the run for later rounds."""
    tables = [TableInput(load_table(DataSource(path=b.path), "preference"), b.path,
                         b.name, b.digest) for b in batches]
    if tables:
        log_table_inputs(ctx.client(), ctx.parent_run_id, tables, "retrain_batch")
    record_consumed(ctx, [(b.digest, b.path) for b in batches])
