"""Tracking calls whose answer is needed cannot be spooled; :class:`GuardedClient` bounds
their wait for a lost server by ``tracking.outage_limit_s`` instead of MLflow's minutes of
retries, then stops the run with :class:`~tasks.platform.mlflow.spool.TrackingOutage`."""

from __future__ import annotations

import os
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from mlflow.tracking import MlflowClient

from tasks.platform.mlflow import spool

QUICK_S, AGAIN_S = 5, 30  # request timeouts: first try, tries while waiting
LONG_CALLS = frozenset({"log_artifact", "log_artifacts", "download_artifacts"})
READS = ("get_", "search_", "list_")  # client calls that only read


def server_answers(uri: str) -> bool:
    """Does the tracking server at ``uri`` answer its /health page (one try)?"""
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=QUICK_S):
            return True  # (an HTTP error status raises HTTPError, an OSError)
    except OSError:
        return False


class GuardedClient:
    """An MlflowClient (``raw``) whose calls are retried every ``poll_s`` for at most ``limit_s``
    while the server is away; artifact transfers (:data:`LONG_CALLS`) start once /health answers."""

    def __init__(self, client: MlflowClient, limit_s: float, parent_run_id: str,
                 workdir: str | Path, poll_s: float = 2.0):
        self.raw, self.limit_s, self.poll_s = client, limit_s, poll_s
        self.parent_run_id, self.workdir = parent_run_id, workdir

    def __getattr__(self, name: str):
        fn = getattr(self.raw, name)
        if name.startswith("_") or not callable(fn):
            return fn

        def call(*args, **kwargs):
            if name in LONG_CALLS:
                self.wait_for_server(name)
                try:
                    return fn(*args, **kwargs)
                except Exception as err:
                    self.raise_if_refused(err, name)
                    raise
            since = None
            while True:
                try:
                    # once the server has not answered, a slow answer is not taken for none
                    with spool.fail_fast(QUICK_S if since is None else AGAIN_S):
                        result = fn(*args, **kwargs)
                except Exception as err:  # noqa: BLE001 - classified just below
                    self.raise_if_refused(err, name)
                    if not spool.unreachable(err):
                        raise
                    since = self._waited(since, name)
                    continue
                self._back(since)
                return result

        return call

    def wait_for_server(self, doing: str) -> None:
        """Return once the server answers /health, or raise :class:`TrackingOutage`."""
        since = None
        while not server_answers(self.raw.tracking_uri):
            since = self._waited(since, doing)
        self._back(since)

    def _back(self, since: float | None) -> None:
        if since is not None:
            spool.log.warning("MLflow at %s answers again after %.1f s", self.raw.tracking_uri,
                              time.monotonic() - since)

    def _waited(self, since: float | None, doing: str) -> float:
        now = time.monotonic()
        if since is None:
            spool.log.warning("MLflow at %s not answering (%s); waiting up to %g s "
                              "(tracking.outage_limit_s)", self.raw.tracking_uri, doing,
                              self.limit_s)
            since = now
        elif now - since > self.limit_s:
            raise spool.TrackingOutage(
                f"the MLflow server at {self.raw.tracking_uri} has not answered for "
                f"{now - since:.0f} s (tracking.outage_limit_s={self.limit_s:g}; at {doing}); "
                f"{self.kept()}")
        time.sleep(self.poll_s)
        return since

    def raise_if_refused(self, err: BaseException, doing: str) -> None:
        """Stop the run at once on a refused login (401) or write (403). A 403 on a read is
        left to the caller: MLflow's auth app answers 403, not 404, for a missing alias."""
        code = spool.refused(err)
        if code == 401 or (code == 403 and not doing.startswith(READS)):
            raise spool.LoginRefused(f"{spool.refusal(code, self.raw.tracking_uri, doing)}; "
                                     f"{self.kept()}") from None

    def kept(self) -> str:
        left = spool.spooled_left(self.workdir)
        spooled = (f" and {left} tracking records spooled in {Path(self.workdir) / '.spool'}, "
                   "sent first when the run is resumed") if left else ""
        return (f"run {self.parent_run_id} keeps its finished stages, their outputs in "
                f"{self.workdir}{spooled}")


def one_try(client, doing: str, call: Callable, again: Callable):
    """``call()`` (a multi-request fluent-API operation) without MLflow's retries; after waiting
    out an outage, ``again()`` -> its result, or None to run ``call()`` again."""
    if not isinstance(client, GuardedClient):
        return call()
    while True:
        try:
            with spool.fail_fast(int(os.environ.get(spool.TIMEOUT_ENV, "120"))):
                return call()
        except Exception as err:
            client.raise_if_refused(err, doing)
            if server_answers(client.raw.tracking_uri):
                raise
        client.wait_for_server(doing)
        result = again()
        if result is not None:
            return result
