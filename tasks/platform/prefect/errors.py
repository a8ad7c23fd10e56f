"""The Prefect platform's errors, importing nothing, so the CLI can catch them without
loading MLflow or Prefect."""

from __future__ import annotations


class RoutingError(ValueError):
    """A routing setting that cannot work, raised before any run is opened."""
