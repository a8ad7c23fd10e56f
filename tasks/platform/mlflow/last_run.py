"""The last parent run this process opened, for the CLI's message when a stop or outage ends
it. Apart from runs.py so reading it imports no MLflow."""

from __future__ import annotations

_LAST_PARENT: list[str | None] = [None]


def note_parent_run(run_id: str) -> None:
    _LAST_PARENT[0] = run_id


def last_parent_run() -> str | None:
    return _LAST_PARENT[0]
