"""Sample tables on a run, as MLflow's ``log_table`` writes them but replacing a table of the
same name (a resumed iteration would hold its rows twice) and keeping the run's table list
within MLflow's tag length cap."""

from __future__ import annotations

import json
import posixpath
from pathlib import Path

from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_LOGGED_ARTIFACTS
from mlflow.utils.validation import MAX_TAG_VAL_LENGTH


def log_table_file(client: MlflowClient, run_id: str, path: Path, artifact_file: str) -> None:
    """Upload ``path`` (pandas ``split`` JSON) as ``artifact_file``, replacing one of that
    name, and list it as a table."""
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
    """The tag's list within MLflow's cap, oldest dropped first (their files stay)."""
    while len(listed) > 1 and len(json.dumps(listed)) > limit:
        listed = listed[1:]
    return listed
