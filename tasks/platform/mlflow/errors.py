"""The MLflow platform's errors, and the last parent run this process opened (for the CLI's
message when a stop or outage ends it); importing nothing, so the CLI need not load MLflow."""

from __future__ import annotations


class RegistryError(ValueError):
    """A promote/rollback that cannot be done (no such version, nothing to roll back to)."""


class TrackingOutage(Exception):  # noqa: N818 - a stop, named after its cause
    """The tracking server has not answered for longer than the outage limit."""

    until = "once the server answers"  # when the run can be continued


class ApprovalError(RegistryError):
    """An approval answer that cannot be taken (no such candidate, or the champion moved)."""


class PurgeFailed(Exception):  # noqa: N818 - a stop, named after its cause
    """MLflow's gc (`mlflow gc`) failed on runs that are still there."""

    until = "once the store answers"


_LAST_PARENT: list[str | None] = [None]


def note_parent_run(run_id: str) -> None:
    _LAST_PARENT[0] = run_id


def last_parent_run() -> str | None:
    return _LAST_PARENT[0]
