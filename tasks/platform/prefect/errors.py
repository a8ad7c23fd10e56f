"""The Prefect platform's errors, in a module that imports nothing: the CLI names them in its
except clauses without loading MLflow or Prefect."""

from __future__ import annotations


class RoutingError(ValueError):
    """A routing setting that cannot work (no Prefect server, no such deployment): raised
    before any run is opened."""
