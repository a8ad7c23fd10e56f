"""The MLflow platform's errors, in a module that imports nothing (no MLflow): the CLI names
them in its except clauses without loading MLflow."""

from __future__ import annotations


class RegistryError(ValueError):
    """A promote/rollback that cannot be done (no such version, nothing to roll back to)."""


class TrackingOutage(Exception):  # noqa: N818 - a stop, named after its cause
    """The tracking server has not answered for longer than the outage limit."""

    until = "once the server answers"  # when the run can be continued


class ApprovalError(RegistryError):
    """An answer that cannot be taken: no candidate waits, several do and none was named,
    the version named is no candidate, or the champion moved since its gate (approve)."""


class PurgeFailed(Exception):  # noqa: N818 - a stop, named after its cause
    """MLflow's gc (`mlflow gc`) failed on runs that are still there."""

    until = "once the store answers"
