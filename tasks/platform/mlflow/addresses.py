"""The tracking URI in use and the MLflow UI's links, as text. Imports no MLflow, so the CLI
prints them without loading it."""

from __future__ import annotations

import os
import urllib.parse

from tasks.platform.redact import redact

# every UI link opens in "Model training" mode: the UI's own switch defaults to GenAI whatever
# the experiment's kind tag says, and the URL's parameter wins over it
TRAINING_MODE = "workflowType=machine_learning"


def tracking_source(configured: str | None) -> tuple[str, str]:
    """The MLflow store a command uses and its source: config, $MLFLOW_TRACKING_URI, ./mlflow.db."""
    if configured:
        return configured, "tracking.tracking_uri in the config"
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"], "MLFLOW_TRACKING_URI"
    return "sqlite:///mlflow.db", "the default, as MLFLOW_TRACKING_URI is not set"


def default_tracking_uri(configured: str | None) -> str:
    return tracking_source(configured)[0]


def _ui(tracking_uri: str) -> str:
    """A tracking server's UI (its password hidden), else where `mlflow ui` serves a local store."""
    if tracking_uri.startswith(("http://", "https://")):
        return redact(tracking_uri).rstrip("/")
    return "http://127.0.0.1:5000"  # where `mlflow ui` serves by default


def runs_table_url(tracking_uri: str, experiment_id: str) -> str:
    """The experiment's runs table in the MLflow UI."""
    return f"{_ui(tracking_uri)}/#/experiments/{experiment_id}/runs?{TRAINING_MODE}"


def run_page(tracking_uri: str, experiment_id: str, run_id: str) -> str | None:
    """The run's page in a tracking server's MLflow UI; None for a local store."""
    if not tracking_uri.startswith(("http://", "https://")):
        return None
    return f"{_ui(tracking_uri)}/#/experiments/{experiment_id}/runs/{run_id}?{TRAINING_MODE}"


def compare_url(tracking_uri: str, experiment_id: str, run_ids: list[str]) -> str:
    """MLflow's compare view of ``run_ids`` of one experiment."""

    def listed(ids: list[str]) -> str:  # ["a","b"], percent-encoded (it sits in markdown)
        return urllib.parse.quote("[" + ",".join(f'"{i}"' for i in ids) + "]", safe=",")

    return (f"{_ui(tracking_uri)}/#/compare-runs?runs={listed(run_ids)}"
            f"&experiments={listed([experiment_id])}&{TRAINING_MODE}")
