"""The parent run of the last pipeline run context this process made: what the CLI names
when a stop signal or an outage ends the process. Kept apart from runs.py so that reading it
imports nothing of MLflow (a stop can come before any run was opened)."""

from __future__ import annotations

_LAST_PARENT: list[str | None] = [None]


def note_parent_run(run_id: str) -> None:
    _LAST_PARENT[0] = run_id


def last_parent_run() -> str | None:
    """The parent run of the last run context made in this process (None before one)."""
    return _LAST_PARENT[0]
