"""A collection in a Label Studio project of preference pairs: the pairwise page, one task per
pair, the votes read back, and the task -> pair link kept in the collection's MLflow run for
pulls. A task holds only what a labeller needs (prompt, responses, an opaque reference); known
answers, policy version and scores stay in MLflow, unseen by labellers.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

from data_checks.labels import read_labelled
from tasks.config.pipeline_config import PipelineConfig
from tasks.platform.mlflow.addresses import default_tracking_uri
from tasks.platform.mlflow.runs import ensure_experiment, set_tags, tracking_client
from tasks.platform.mlflow.tags import (
    COLLECTION_FILE_TAG,
    COLLECTION_LABEL_STUDIO_TAG,
    COLLECTION_TAG,
)
from tasks.retrain.labels.client import LabelStudio, LabelStudioError, NotFound
from tasks.retrain.store import IN_STUDIO, find_collection, log_studio_link, studio_link_text

# The page: the conversation so far, the two answers side by side, one required choice.
LABEL_CONFIG = """<View>
  <Header value="Which response answers the conversation better?"/>
  <Paragraphs name="prompt" value="$prompt" layout="dialogue" nameKey="role"
              textKey="content"/>
  <View style="display: flex; gap: 1em;">
    <View style="flex: 50%; padding: 0.5em; border: 1px solid #ccc;">
      <Header value="Response A" size="5"/>
      <Text name="response_a" value="$response_a"/>
    </View>
    <View style="flex: 50%; padding: 0.5em; border: 1px solid #ccc;">
      <Header value="Response B" size="5"/>
      <Text name="response_b" value="$response_b"/>
    </View>
  </View>
  <Choices name="choice" toName="prompt" choice="single-radio" required="true"
           showInline="true">
    <Choice value="A" hotkey="1"/>
    <Choice value="B" hotkey="2"/>
    <Choice value="Tie" hotkey="3"/>
    <Choice value="Skip" hotkey="4"/>
  </Choices>
</View>"""
CHOICE_OF = {"A": "a", "B": "b", "Tie": "tie", "Skip": "skip"}
IMPORT_CHUNK = 500


@dataclass(frozen=True)
class Vote:
    """One finished annotation (``choice`` as the tool gave it, or ``skip`` when cancelled)."""

    task_id: int
    annotation_id: int
    labeller: str
    choice: str
    updated_at: str


def task_data(collection: str, pair: dict) -> dict:
    """A pair as the page shows it: a conversation's turns (a plain prompt: one user turn), both
    answers, and a reference that names no policy version and no known answer."""
    prompt = pair["prompt"]
    if not isinstance(prompt, list):
        prompt = [{"role": "user", "content": prompt}]
    turns = [{"role": str(m.get("role", "")), "content": str(m.get("content", ""))} for m in prompt]
    return {"prompt": turns, "response_a": str(pair["response_a"]),
            "response_b": str(pair["response_b"]),
            "ref": hashlib.sha256(f"{collection}\0{pair['id']}".encode()).hexdigest()[:16]}


def ensure_project(ls: LabelStudio, title: str, description: str) -> int:
    """The id of the project called ``title``, created with the pairwise page if need be."""
    out = ls.get("/api/projects/", what="list projects", title=title, page_size=1000)
    rows = out.get("results", []) if isinstance(out, dict) else out
    for row in rows:
        if row.get("title") == title:
            return int(row["id"])
    made = ls.call("POST", "/api/projects/", {"title": title, "description": description,
                                              "label_config": LABEL_CONFIG},
                   what="create projects")
    return int(made["id"])


def add_pairs(ls: LabelStudio, project_id: int, datas: list[dict]) -> list[int]:
    """One task per pair (in order) -> their task ids."""
    ids: list[int] = []
    for i in range(0, len(datas), IMPORT_CHUNK):
        out = ls.call("POST", f"/api/projects/{project_id}/import?return_task_ids=true",
                      datas[i:i + IMPORT_CHUNK], what="add tasks to the project")
        ids += [int(t) for t in out.get("task_ids", [])]
    if len(ids) != len(datas):
        raise NotFound(f"Label Studio at {ls.url}: project {project_id} took {len(ids)} of "
                       f"{len(datas)} tasks")
    return ids


def read_tasks(ls: LabelStudio, project_id: int) -> dict[int, tuple[dict, list[Vote]]]:
    """Every annotated task -> (its data as the tool holds it now, its finished votes)."""
    rows = ls.get(f"/api/projects/{project_id}/export", what="export the project's "
                  "annotations", exportType="JSON")
    names = ls.users()
    out: dict[int, tuple[dict, list[Vote]]] = {}
    for task in rows:
        votes = []
        for a in task.get("annotations", []):
            who = a.get("completed_by")
            who = who.get("id") if isinstance(who, dict) else who
            choice = "skip" if a.get("was_cancelled") else _choice(a.get("result") or [])
            votes.append(Vote(int(task["id"]), int(a["id"]), names.get(int(who), str(who))
                              if who is not None else "unknown", choice,
                              str(a.get("updated_at") or a.get("created_at") or "")))
        out[int(task["id"])] = (task.get("data") or {}, votes)
    return out


def _choice(result: list[dict]) -> str:
    """The ``choice`` control's value; any other answer as text, so the pull can name it."""
    picked = [r for r in result if r.get("from_name") == "choice"]
    if len(picked) != 1:
        texts = [str(r.get("value")) for r in result]
        return "; ".join(texts) if texts else ""
    values = picked[0].get("value", {}).get("choices") or []
    return values[0] if len(values) == 1 else ", ".join(map(str, values))


def accounts(ls: LabelStudio, emails: list[str]) -> dict[str, int]:
    """{email: account id} in the key's organisation, missing ones created (the owner's key)."""
    have = {email: uid for uid, email in ls.users().items()}
    for email in emails:
        if email not in have:
            made = ls.call("POST", "/api/users/", {"email": email,
                                                   "username": email.split("@")[0]},
                           what="add users to the organisation")
            have[email] = int(made["id"])
    return {e: have[e] for e in emails}


def vote(ls: LabelStudio, task_id: int, choice: str, as_user: int | None = None) -> None:
    """Annotate one task with a, b, tie or skip, as ``as_user`` or the key's account."""
    body: dict[str, Any] = {"result": [{
        "from_name": "choice", "to_name": "prompt", "type": "choices",
        "value": {"choices": [{v: k for k, v in CHOICE_OF.items()}[choice]]}}]}
    if as_user is not None:
        body["completed_by"] = as_user
    ls.call("POST", f"/api/tasks/{task_id}/annotations/", body, what="annotate tasks")


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
        return f"{self.url}/projects/{self.project_id}/data"

    @classmethod
    def read(cls, text: str) -> StudioLink:
        raw = json.loads(text)
        return cls(raw["url"], int(raw["project_id"]), raw["project_title"],
                   {int(k): v for k, v in raw["tasks"].items()}, raw["shown"])


def send(cfg: PipelineConfig, client, run_id: str, cid: str, rows: list[dict]) -> StudioLink:
    """Send one task per pair (known answers unmarked); log the link on the collection run."""
    ls = LabelStudio.from_env(cfg.collect.destination.url)
    title = cfg.collect.destination.project or f"rlhf {cfg.tracking.registered_policy}"
    project_id = ensure_project(ls, title, "Pairs of answers to compare, sent by the RLHF "
                                "pipeline's `rlhf collect`.")
    datas = [task_data(cid, r) for r in rows]
    ids = add_pairs(ls, project_id, datas)
    link = StudioLink(ls.url, project_id, title,
                      {t: r["id"] for t, r in zip(ids, rows)},
                      {r["id"]: d for r, d in zip(rows, datas)})
    log_studio_link(client, run_id, {**asdict(link), "tasks": {str(k): v for k, v in
                                                                link.tasks.items()}})
    set_tags(client, run_id, {COLLECTION_LABEL_STUDIO_TAG: link.page})
    return link


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
    """Refuse a file of a Label Studio collection's rows: `rlhf label pull` imports them once."""
    ids = {str(i).strip() for i in read_labelled(path)["id"].tolist()}
    cids = sorted({i.rsplit("-", 1)[0] for i in ids if "-" in i})
    if not cids:
        return
    uri = default_tracking_uri(cfg.tracking.tracking_uri)
    client = tracking_client(uri)
    exp_id = ensure_experiment(client, cfg.tracking.experiment, uri)
    for cid in cids:
        run = find_collection(client, exp_id, cid, IN_STUDIO)
        if run is not None:
            raise LabelStudioError(
                f"{path}: its rows come from collection {cid}, which went to Label Studio "
                f"({run.data.tags[COLLECTION_LABEL_STUDIO_TAG]}): bring its labels in "
                f"with `rlhf label pull {cid}` (a pair is imported once)")
