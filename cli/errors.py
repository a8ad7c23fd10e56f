"""How an `rlhf` command ends: an expected failure in one short paragraph on the terminal, not a
traceback, and every stop signal within seconds, whatever the command waits on.

A user's error (bad config or file, failed gate, refused resume) prints its message and exits 1
or 2; a filter drops the traceback Prefect's run loggers would add (the stage's MLflow run keeps
it). A server outage (tracking past ``tracking.outage_limit_s``, or Prefect) exits 75 with the
command that continues. The error classes come from light modules: every command loads this one.

A stop (SIGTERM, SIGINT) is first handled as usual (runs marked FAILED, so ``rlhf run --resume``
continues them) and the CLI prints what is kept. As that clean-up can wait on a server that is
gone, a watcher thread makes MLflow's requests fail fast and ends the process after
``RLHF_STOP_GRACE_S`` seconds or at a second Ctrl-C.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

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
GRACE_ENV = "RLHF_STOP_GRACE_S"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


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


class Stopped(BaseException):  # noqa: N818 - like KeyboardInterrupt, not an error
    """SIGTERM outside a flow run (inside one, Prefect raises its TerminationSignal)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def stop_signal(err: BaseException) -> int | None:
    """The signal number behind ``err`` when it is how a stop signal ends a command."""
    if isinstance(err, Stopped):
        return err.signum
    if isinstance(err, KeyboardInterrupt):
        return signal.SIGINT
    if type(err).__name__ == "TerminationSignal":  # prefect.exceptions, not imported here
        return getattr(err, "signal", signal.SIGTERM)
    return None


def _raise_stopped(signum, _frame) -> None:
    raise Stopped(signum)


def _watch(read_fd: int, message: Callable[[int], str]) -> None:
    """Read the signal numbers Python writes to the wakeup pipe; a first stop arms the deadline."""

    def hard_exit(signum: int, why: str) -> None:
        try:
            sys.stderr.write(f"\nrlhf: {message(signum)} (ended at once: {why})\n")
            sys.stderr.flush()
        finally:
            os._exit(128 + signum)

    armed = False
    while True:
        try:
            data = os.read(read_fd, 64)
        except OSError:
            return
        if not data:
            return  # the write end was closed: the command is over
        for signum in (n for n in data if n in STOP_SIGNALS):
            if armed:
                # a second Ctrl-C: no more waiting (a second SIGTERM is Prefect's engine
                # passing the first one on, once its flow run is marked crashed)
                if signum == signal.SIGINT:
                    hard_exit(signum, "a second Ctrl-C")
                continue
            armed = True
            os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
            os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = "3"
            grace_s = float(os.environ.get(GRACE_ENV) or 10)
            timer = threading.Timer(grace_s, hard_exit,
                                    (signum, f"its clean-up still waited after {grace_s:g} s"))
            timer.daemon = True
            timer.start()


@contextmanager
def stop_within_seconds(message: Callable[[int], str]) -> Iterator[None]:
    """While the command runs, SIGTERM raises :class:`Stopped` and every stop signal arms the
    deadline; ``message(signum)`` is printed if the deadline ends the process. Outside the main
    thread (no handler can be installed there) this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    old_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    old_term = signal.signal(signal.SIGTERM, _raise_stopped)
    thread = threading.Thread(target=_watch, args=(read_fd, message), name="rlhf-stop-watcher",
                              daemon=True)
    thread.start()
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old_term)
        signal.set_wakeup_fd(old_fd)
        os.close(write_fd)  # the watcher reads EOF and returns
        thread.join(timeout=1)
        os.close(read_fd)
