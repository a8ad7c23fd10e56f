"""Expected failures end with one short paragraph on the terminal, not a traceback.

A bad config, a malformed file, a failed data gate or a refused resume is the user's to fix:
the CLI prints its message (naming the field or file and the fix) and exits 1 or 2. Prefect
logs such an exception with its traceback from inside the task and flow engines; a filter on
its run loggers drops the traceback from those records (the message stays, at ERROR). The
traceback is still kept on the stage's MLflow run (``error/traceback.txt``).

A server that went away mid-run is not the user's error either: a tracking outage past
``tracking.outage_limit_s`` (tasks/platform/mlflow/spool.py) or a Prefect API that stopped answering
ends with exit 75 (EX_TEMPFAIL, "try again later") and the command that continues the run; so does
an `rlhf retrain` that found another retrain of its store holding the slot (nothing ran).

The error classes come from modules that import nothing heavy: every command loads this
module, and `rlhf runs` must not pay for pandas, MLflow or torch to name them.
"""

from __future__ import annotations

import logging

from data_checks.errors import DataError, ValidationFailed
from tasks.config.pipeline_config import ConfigError
from tasks.gc.lock import StoreBusy
from tasks.pipeline.identity import ResumeRefused
from tasks.pipeline.rewards import RewardSourceDown
from tasks.platform.mlflow.errors import PurgeFailed, RegistryError, TrackingOutage
from tasks.platform.prefect.errors import RoutingError
from tasks.retrain.labels.client import LabelStudioError

# exit 2: fix the input and re-run (a registry error: a version or alias that is not there;
# a Label Studio server that does not answer or refuses the key; a served reward model that
# stayed down: resume once it answers)
USAGE_ERRORS = (ConfigError, DataError, ResumeRefused, RegistryError, RoutingError,
                LabelStudioError, RewardSourceDown)
GATE_ERRORS = (ValidationFailed,)                       # exit 1: the data gate said no
EXPECTED = USAGE_ERRORS + GATE_ERRORS
# exit 75: resume when it is back; a gc that waited too long for another, or whose MLflow
# gc failed, is run again later
OUTAGES = (TrackingOutage, StoreBusy, PurgeFailed)
EX_TEMPFAIL = 75
RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")


class _NoTracebackForExpected(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, EXPECTED + OUTAGES) or prefect_gone(exc):
            record.exc_info, record.exc_text = None, None
            record.msg = str(record.msg).split("\n", 1)[0]  # the CLI prints the whole text
        return True


_FILTER = _NoTracebackForExpected()


def quiet_expected_failures() -> None:
    """Install the filter on Prefect's flow- and task-run loggers (idempotent)."""
    for name in RUN_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)


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
