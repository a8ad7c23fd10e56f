"""The collect -> label -> retrain loop's first flows: `collect`, `label-import` and `label-pull`.
No ``from __future__ import annotations`` (Prefect reads the signature's classes)."""

from prefect import flow

from flows.deployment import SERVED, served_config
from tasks.config.pipeline_config import PipelineConfig
from tasks.platform.mlflow.tags import LABELS_SEED_TAG
from tasks.platform.prefect.prefect_api import rename_flow_run
from tasks.retrain.labels.collect import collect
from tasks.retrain.labels.imports import import_labels
from tasks.retrain.labels.pull import PullResult, pull
from tasks.retrain.records import CollectResult, LabelImport


@flow(name="collect", flow_run_name="collect", log_prints=True)
def collect_flow(config: PipelineConfig = SERVED) -> CollectResult:
    """Sample ``collect.policy`` (default: the champion) k times on fresh prompts of the
    pool and write the labelling file to ``collect.out_dir``.

    Args:
        config: The served pipeline config; its ``collect`` section sets the policy, the
            prompt pool, k, the temperature and the known-answer pairs.
    """
    config = served_config(config)
    out = collect(config)
    rename_flow_run(f"collect-{out.policy.replace('/', '-v')}-{out.collection}")
    print(out.text())
    return out


@flow(name="label-import", flow_run_name="label-import", log_prints=True)
def label_import(config: PipelineConfig, path: str,
                 labelling_seed: int | None = None) -> LabelImport:
    """Import one labelled file: a preference batch in ``retrain.watch_dir``, or the file
    quarantined with its figures (each with its ``rlhf.preferences.*`` event).

    Args:
        config: The pipeline config (watch folder, tracking, label-quality thresholds).
        path: The labelled file (JSONL/CSV: id, choice, optional labeller).
        labelling_seed: The seed a machine labeller drew with (`rlhf demo-batch`: the demo
            judge's), recorded on the import's MLflow run; None: labelled by people.
    """
    tags = {} if labelling_seed is None else {LABELS_SEED_TAG: str(labelling_seed)}
    out = import_labels(config, path, run_tags=tags)
    rename_flow_run(f"label-import-{out.status.replace(' ', '-')}-{out.file}")
    return out


@flow(name="label-pull", flow_run_name="label-pull", log_prints=True)
def label_pull(config: PipelineConfig = SERVED, collection: str | None = None,
               partial: bool = False) -> list[PullResult]:
    """Pull a collection's finished Label Studio annotations into a preference batch once
    enough tasks are labelled, each pair exactly once.

    Args:
        config: The served pipeline config (tracking, watch folder, collect.destination).
        collection: One collection id (e.g. v3-1a2b3c4d); None: all of them.
        partial: Make a batch of what is labelled now, below collect.destination.min_labelled.
    """
    config = served_config(config)
    out = pull(config, collection, partial)
    for result in out:
        print(result.text())
    statuses = sorted({r.status for r in out}) or ["no collections"]
    rename_flow_run(f"label-pull-{'-'.join(s.replace(' ', '-') for s in statuses)}")
    return out
