"""Expected failures end with one short paragraph on the terminal, not a traceback.

A user's error (bad config or file, failed gate, refused resume) prints its message and exits 1
or 2; a filter drops the traceback Prefect's run loggers would add (the stage's MLflow run keeps
it). A server outage (tracking past ``tracking.outage_limit_s``, or Prefect) exits 75 with the
command that continues. The error classes come from light modules: every command loads this one.
"""

from __future__ import annotations

import logging

from data_checks.errors import DataError, ValidationFailed
from tasks.config.pipeline_config import ConfigError
from tasks.gc.lock import StoreBusy
from tasks.pipeline.identity import ResumeRefused
from tasks.pipeline.rewards import RewardSourceDown
from tasks.platform.mlflow.errors import PurgeFailed, RegistryError, TrackingOutage
from tasks.platform.prefect.preflight import RoutingError
from tasks.retrain.labels.client import LabelStudioError

# exit 2: fix the input and re-run (a missing version or alias, a Label Studio server that
# refuses, a served reward model that stayed down: resume once it answers)
USAGE_ERRORS = (ConfigError, DataError, ResumeRefused, RegistryError, RoutingError,
                LabelStudioError, RewardSourceDown)
GATE_ERRORS = (ValidationFailed,)                       # exit 1: the data gate said no
EXPECTED = USAGE_ERRORS + GATE_ERRORS
# exit 75: resume when it is back; a gc that waited too long for another, or whose MLflow
# gc failed, is run again later
OUTAGES = (TrackingOutage, StoreBusy, PurgeFailed)
EX_TEMPFAIL = 75


def _no_traceback_for_expected(record: logging.LogRecord) -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    if isinstance(exc, EXPECTED + OUTAGES) or prefect_gone(exc):
        record.exc_info, record.exc_text = None, None
        record.msg = str(record.msg).split("\n", 1)[0]  # the CLI prints the whole text
    return True


def quiet_expected_failures() -> None:
    """Install the filter on Prefect's flow- and task-run loggers (idempotent)."""
    for name in ("prefect.flow_runs", "prefect.task_runs"):
        logger = logging.getLogger(name)
        if _no_traceback_for_expected not in logger.filters:
            logger.addFilter(_no_traceback_for_expected)


def exit_code(err: BaseException) -> int:
    if isinstance(err, OUTAGES):
        return EX_TEMPFAIL
    return 1 if isinstance(err, GATE_ERRORS) else 2


def prefect_gone(err: BaseException | None) -> bool:
    """Is ``err``, or an error behind it, the Prefect API not answering (a connection
    refused or timed out once Prefect's client has given up its retries)?"""
    import httpx

    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, httpx.TransportError):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False
