"""Sample tables on a run, as MLflow's ``log_table`` writes them, without its two flaws for
a long PPO stage: it appends to a table of the same name (a resumed iteration would hold its
rows twice) and it lists every table in the run tag ``mlflow.loggedArtifacts``, whose value
MLflow caps at 8000 characters (about 160 tables)."""

from __future__ import annotations

import json
import posixpath
from pathlib import Path

from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_LOGGED_ARTIFACTS
from mlflow.utils.validation import MAX_TAG_VAL_LENGTH


def log_table_file(client: MlflowClient, run_id: str, path: Path, artifact_file: str) -> None:
    """Upload ``path`` (a table JSON in pandas' ``split`` layout, named as ``artifact_file``
    ends) as ``artifact_file``, replacing one of that name, and list it as a table."""
    if path.name != posixpath.basename(artifact_file):
        raise ValueError(f"table {path} must be named {posixpath.basename(artifact_file)}")
    folder = posixpath.dirname(artifact_file) or None
    client.log_artifact(run_id, str(path), folder)
    listed = json.loads(client.get_run(run_id).data.tags.get(MLFLOW_LOGGED_ARTIFACTS, "[]"))
    entry = {"path": artifact_file, "type": "table"}
    if entry not in listed:
        listed = bounded([*listed, entry])
        client.set_tag(run_id, MLFLOW_LOGGED_ARTIFACTS, json.dumps(listed))


def bounded(listed: list[dict], limit: int = MAX_TAG_VAL_LENGTH) -> list[dict]:
    """The tag's list within MLflow's cap: the oldest entries leave first (their files stay
    artifacts; the UI just no longer offers them as tables)."""
    while len(listed) > 1 and len(json.dumps(listed)) > limit:
        listed = listed[1:]
    return listed
