"""A collection in a Label Studio project: its pairs sent as tasks, and the task -> pair link
kept in the collection's MLflow run for pulls, so labellers see only texts.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from tasks.config.pipeline_config import PipelineConfig
from tasks.platform.mlflow.runs import set_tags
from tasks.platform.mlflow.tags import (
    COLLECTION_FILE_TAG,
    COLLECTION_LABEL_STUDIO_TAG,
    COLLECTION_TAG,
)
from tasks.retrain.labels.client import LabelStudio, LabelStudioError
from tasks.retrain.labels.project import (
    Project,
    add_pairs,
    ensure_project,
    opaque_ref,
    task_data,
)
from tasks.retrain.store import (
    finished_collection,
    log_studio_link,
    studio_collection,
    studio_link_text,
)


@dataclass(frozen=True)
class StudioLink:
    """Where a collection's tasks are: server, project, and task id -> pair id."""

    url: str
    project_id: int
    project_title: str
    tasks: dict[int, str]
    shown: dict[str, dict]  # pair id -> the task's data as sent (to spot edited texts)

    @property
    def page(self) -> str:
        return Project(self.url, self.project_id, self.project_title).page

    @classmethod
    def read(cls, text: str) -> StudioLink:
        raw = json.loads(text)
        return cls(raw["url"], int(raw["project_id"]), raw["project_title"],
                   {int(k): v for k, v in raw["tasks"].items()}, raw["shown"])


def project_title(cfg: PipelineConfig) -> str:
    return cfg.collect.destination.project or f"rlhf {cfg.tracking.registered_policy}"


def connect(cfg: PipelineConfig) -> LabelStudio:
    return LabelStudio.from_env(cfg.collect.destination.url)


def send(cfg: PipelineConfig, client, run_id: str, cid: str, rows: list[dict]) -> StudioLink:
    """Send one task per pair (known answers unmarked); log the link on the collection run."""
    ls = connect(cfg)
    project = ensure_project(ls, project_title(cfg), "Pairs of answers to compare, sent by "
                             "the RLHF pipeline's `rlhf collect`.")
    datas = [task_data(r, opaque_ref(cid, r["id"])) for r in rows]
    ids = add_pairs(ls, project, datas)
    link = StudioLink(ls.url, project.id, project.title,
                      {t: r["id"] for t, r in zip(ids, rows)},
                      {r["id"]: d for r, d in zip(rows, datas)})
    log_studio_link(client, run_id, {**asdict(link), "tasks": {str(k): v for k, v in
                                                                link.tasks.items()}})
    set_tags(client, run_id, {COLLECTION_LABEL_STUDIO_TAG: link.page})
    return link


def collection_run(client, experiment_id: str, cid: str):
    """The finished run of collection ``cid`` (LabelStudioError naming it when none)."""
    run = finished_collection(client, experiment_id, cid)
    if run is None:
        raise LabelStudioError(f"no finished collection '{cid}' in this MLflow experiment "
                               "(`rlhf runs` lists runs; collection ids look like "
                               "v3-1a2b3c4d)")
    return run


def read_link(client, run) -> StudioLink:
    """The collection's Label Studio link; a collection written to files says so."""
    cid = run.data.tags.get(COLLECTION_TAG, "?")
    if COLLECTION_LABEL_STUDIO_TAG not in run.data.tags:
        where = run.data.tags.get(COLLECTION_FILE_TAG, "its labelling file")
        raise LabelStudioError(f"collection {cid} was written to files ({where}), not to "
                               "Label Studio: fill its choice column and run `rlhf label "
                               f"import {where}`")
    return StudioLink.read(studio_link_text(client, run))


def refuse_studio_rows(cfg: PipelineConfig, path) -> None:
    """Refuse a labelled file from a Label Studio collection: `rlhf label pull` imports each
    pair once."""
    from data_checks.labels import read_labelled
    from tasks.platform.mlflow.runs import default_tracking_uri, ensure_experiment, tracking_client

    ids = {str(i).strip() for i in read_labelled(path)["id"].tolist()}
    cids = sorted({i.rsplit("-", 1)[0] for i in ids if "-" in i})
    if not cids:
        return
    uri = default_tracking_uri(cfg.tracking.tracking_uri)
    client = tracking_client(uri)
    exp_id = ensure_experiment(client, cfg.tracking.experiment, uri)
    for cid in cids:
        run = studio_collection(client, exp_id, cid)
        if run is not None:
            raise LabelStudioError(
                f"{path}: its rows come from collection {cid}, which went to Label Studio "
                f"({run.data.tags[COLLECTION_LABEL_STUDIO_TAG]}): bring its labels in "
                f"with `rlhf label pull {cid}` (a pair is imported once)")
