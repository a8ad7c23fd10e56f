"""What the retrain loop keeps in MLflow: collection runs, label-import runs, and the
preference batches retrains consumed."""

from __future__ import annotations

import json
from pathlib import Path

from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient

from rlhf_core.eval.collect import prompt_key
from tasks.config.pipeline_config import PipelineConfig
from tasks.platform.mlflow.addresses import default_tracking_uri
from tasks.platform.mlflow.runs import RunContext, experiment_client, log_metrics, set_tags
from tasks.platform.mlflow.tags import (
    COLLECTION_LABEL_STUDIO_TAG,
    COLLECTION_POOL_DIGEST_TAG,
    COLLECTION_TAG,
    CONSUMED_TAG,
    LABELS_COLLECTIONS_TAG,
    LABELS_DECISION_TAG,
    LABELS_PREFERENCE_DIGEST_TAG,
)

RECORD, PROMPTS = "collection/record.json", "collection/prompts.json"
LINK = "collection/label_studio.json"
CONSUMED_COPY = "consumed_batches"  # artifact folder: a copy of each batch a retrain consumed


def every_run(client: MlflowClient, experiment_ids: list[str], filter_string: str = "",
              order_by: list[str] | None = None,
              run_view_type: int = ViewType.ACTIVE_ONLY) -> list:
    """Every run ``filter_string`` selects, page by page: a long-lived loop makes many."""
    out, token = [], None
    while True:
        page = client.search_runs(experiment_ids, filter_string, run_view_type,
                                  max_results=1000, order_by=order_by, page_token=token)
        out += list(page)
        token = page.token
        if not token:
            return out


FINISHED = "attributes.status = 'FINISHED'"
IN_STUDIO = f"tags.`{COLLECTION_LABEL_STUDIO_TAG}` LIKE '%'"  # a collection sent to Label Studio


# ---- collections -----------------------------------------------------------------------------
def open_collection_run(client: MlflowClient, experiment_id: str, run_name: str,
                        tags: dict[str, str]) -> str:
    return client.create_run(experiment_id, run_name=run_name, tags=tags).info.run_id


def log_collection_files(client: MlflowClient, run_id: str, files: list[Path],
                         rows: list[dict], prompts: list[str]) -> None:
    """The labelling files (``collection/``), the pairs' record and the prompts used."""
    for path in files:
        client.log_artifact(run_id, str(path), "collection")
    client.log_dict(run_id, rows, RECORD)
    client.log_dict(run_id, prompts, PROMPTS)


def pool_prompts_used(client: MlflowClient, experiment_id: str,
                      pool_digest: str) -> tuple[int, set[str]]:
    """(finished collections of the prompt pool of digest ``pool_digest``, the prompts they
    used by ``prompt_key``)."""
    runs = every_run(client, [experiment_id],
                     f"tags.`{COLLECTION_POOL_DIGEST_TAG}` = '{pool_digest}' and {FINISHED}")
    used: set[str] = set()
    for run in runs:
        path = client.download_artifacts(run.info.run_id, PROMPTS)
        used |= {prompt_key(p) for p in json.loads(Path(path).read_text())}
    return len(runs), used


def find_collection(client: MlflowClient, experiment_id: str, cid: str, where: str = FINISHED):
    """The run of collection ``cid`` that ``where`` also selects (default: finished), or None."""
    runs = client.search_runs([experiment_id], max_results=1, filter_string=(
        f"tags.`{COLLECTION_TAG}` = '{cid}' and {where}"))
    return runs[0] if runs else None


def collection_by_run_id(client: MlflowClient, run_id: str):
    return client.get_run(run_id)


def collection_records(client: MlflowClient, experiment_id: str, ids: list[str]) -> dict[str, dict]:
    """The pairs (texts, reward-model scores, known answers) of the collections the ids name
    (``<collection>-<nnnn>``) -> {id: pair}."""
    records = {}
    for cid in sorted({i.rsplit("-", 1)[0] for i in ids if "-" in i}):
        run = find_collection(client, experiment_id, cid)
        if run is not None:
            path = client.download_artifacts(run.info.run_id, RECORD)
            records.update({r["id"]: r for r in json.loads(Path(path).read_text())})
    return records


def log_studio_link(client: MlflowClient, run_id: str, link: dict) -> None:
    client.log_dict(run_id, link, LINK)


def studio_link_text(client: MlflowClient, run) -> str:
    """The Label Studio link a collection run keeps (JSON text)."""
    return Path(client.download_artifacts(run.info.run_id, LINK)).read_text()


def studio_collections(client: MlflowClient, experiment_id: str) -> list:
    """Finished collections that went to Label Studio, oldest first."""
    return every_run(client, [experiment_id], f"{IN_STUDIO} and {FINISHED}",
                     ["attributes.start_time ASC"])


# ---- label imports -----------------------------------------------------------------------------
def record_label_import(client: MlflowClient, experiment_id: str, run_name: str,
                        tags: dict[str, str], metrics: dict[str, float], path: Path) -> str:
    """A finished label-import run with its tags, figures and file -> its id."""
    run_id = client.create_run(experiment_id, run_name=run_name, tags=tags).info.run_id
    log_metrics(client, run_id, metrics, 0)
    client.log_artifact(run_id, str(path), "labels")
    client.set_terminated(run_id, status="FINISHED")
    return run_id


def usual_rate(client: MlflowClient, experiment_id: str, metric: str,
               last: int = 5) -> float | None:
    """Median of ``metric`` over the last accepted label imports (None: none yet)."""
    runs = client.search_runs([experiment_id], max_results=last, order_by=[
        "attributes.start_time DESC"], filter_string=f"tags.`{LABELS_DECISION_TAG}` = 'accepted'")
    rates = sorted(r.data.metrics[metric] for r in runs if metric in r.data.metrics)
    return rates[len(rates) // 2] if rates else None


def batch_sources(cfg: PipelineConfig, digests: list[str]) -> dict[str, str]:
    """Digest -> the collections its label import named, else ``offline`` (no label import)."""
    client, exp_id = experiment_client(default_tracking_uri(cfg.tracking.tracking_uri),
                                       cfg.tracking.experiment)
    out = {}
    for digest in digests:
        runs = [] if exp_id is None else client.search_runs(
            [exp_id], max_results=1,
            filter_string=f"tags.`{LABELS_PREFERENCE_DIGEST_TAG}` = '{digest}'")
        names = json.loads(runs[0].data.tags.get(LABELS_COLLECTIONS_TAG, "[]")) if runs else []
        out[digest] = ", ".join(f"collection {c} (from policy v{c.split('-')[0][1:]})"
                                for c in names) or "offline"
    return out


# ---- consumed batches --------------------------------------------------------------------------
def consumed_batches(cfg: PipelineConfig) -> dict[str, str]:
    """Digest of each batch finished retrains consumed -> the run keeping its copy, in order."""
    client, exp_id = experiment_client(default_tracking_uri(cfg.tracking.tracking_uri),
                                       cfg.tracking.experiment)
    if exp_id is None:
        return {}
    runs = every_run(client, [exp_id], f"tags.`{CONSUMED_TAG}` != '' and {FINISHED}",
                     ["attributes.start_time ASC"])
    return {d: r.info.run_id for r in runs for d in json.loads(r.data.tags[CONSUMED_TAG])}


def record_consumed(ctx: RunContext, batches: list[tuple[str, str]]) -> None:
    """Mark (digest, file) batches consumed by the parent run: a copy of each, digests as tag."""
    client = ctx.client()
    for digest, path in batches:
        client.log_artifact(ctx.parent_run_id, path, f"{CONSUMED_COPY}/{digest}")
    set_tags(ctx.client(), ctx.parent_run_id, {CONSUMED_TAG: json.dumps([d for d, _ in batches])})


def consumed_copy(ctx: RunContext, run_id: str, digest: str, root: Path) -> Path | None:
    """Download run ``run_id``'s copy of batch ``digest`` under ``root`` (None: no copy)."""
    client = ctx.client()
    files = [f.path for f in client.list_artifacts(run_id, f"{CONSUMED_COPY}/{digest}")]
    if not files:
        return None
    root.mkdir(parents=True, exist_ok=True)
    return Path(client.download_artifacts(run_id, files[0], str(root)))
