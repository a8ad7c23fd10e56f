"""The tracking URI in use and the MLflow UI's links, as text. Imports no MLflow, so the CLI
prints them without loading it."""

from __future__ import annotations

import os

from tasks.platform.redact import redact

LOCAL_UI = "http://127.0.0.1:5000"  # where `mlflow ui` serves by default


def default_tracking_uri(configured: str | None) -> str:
    """Config value, else $MLFLOW_TRACKING_URI, else a SQLite file in the working folder."""
    return configured or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db"


# every UI link opens in "Model training" mode: the UI's own switch defaults to GenAI whatever
# the experiment's kind tag says, and the URL's parameter wins over it
TRAINING_MODE = "workflowType=machine_learning"


def runs_table_url(tracking_uri: str, experiment_id: str) -> str:
    """The experiment's runs table in the MLflow UI (a local store: where `mlflow ui` serves)."""
    base = redact(tracking_uri).rstrip("/") if tracking_uri.startswith(("http://", "https://")) \
        else LOCAL_UI
    return f"{base}/#/experiments/{experiment_id}/runs?{TRAINING_MODE}"


def run_page(tracking_uri: str, experiment_id: str, run_id: str) -> str | None:
    """The run's page in a tracking server's MLflow UI; None for a local store."""
    if not tracking_uri.startswith(("http://", "https://")):
        return None
    return f"{redact(tracking_uri).rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}" \
        f"?{TRAINING_MODE}"


def compare_url(tracking_uri: str, experiment_id: str, run_ids: list[str]) -> str:
    """MLflow's compare view of ``run_ids`` of one experiment."""
    base = redact(tracking_uri).rstrip("/") if tracking_uri.startswith(("http://", "https://")) \
        else LOCAL_UI
    import urllib.parse

    def listed(ids: list[str]) -> str:  # ["a","b"], percent-encoded (it sits in markdown)
        return urllib.parse.quote("[" + ",".join(f'"{i}"' for i in ids) + "]", safe=",")

    return (f"{base}/#/compare-runs?runs={listed(run_ids)}&experiments={listed([experiment_id])}"
            f"&{TRAINING_MODE}")
