"""Live progress of a long stage in the Prefect UI: a progress artifact and a log line each
time the stage logs. While a bar is on the terminal the lines stay off it (the bar shows the
same figures)."""

from __future__ import annotations

import logging
import time

from tasks.platform.mlflow.runs import StepLogger
from tasks.platform.prefect.prefect_api import in_prefect_run

SHOWN = ("train/loss", "train/accuracy", "objective/scores", "objective/kl",
         "response/eos_rate", "judge/score")


class _NotOnTheTerminal(logging.Filter):
    """On a handler writing to a terminal: drops the progress lines of a stage with a bar."""

    def __init__(self, stream):
        super().__init__()
        self.stream = stream

    def filter(self, record: logging.LogRecord) -> bool:
        return not (getattr(record, "rlhf_bar", False) and self.stream.isatty())


def keep_lines_off_the_bar(logger: logging.Logger | logging.LoggerAdapter) -> None:
    """Make every stream handler ``logger`` reaches drop progress lines while a bar is on its
    terminal (idempotent)."""
    node = logger.logger if isinstance(logger, logging.LoggerAdapter) else logger
    while node is not None:
        for handler in node.handlers:
            stream = getattr(handler, "stream", None)
            if stream is not None and hasattr(stream, "isatty") and not any(
                    isinstance(f, _NotOnTheTerminal) for f in handler.filters):
                handler.addFilter(_NotOnTheTerminal(stream))
        node = node.parent if node.propagate else None


class StageProgress:
    """Callable ``(step, metrics)``: forwards to ``log_fn``, logs a line, and updates the
    progress artifact at most every ``min_interval_s`` (each update blocks on Prefect's API).
    ``bar``: the stage draws a progress bar on the terminal (its lines stay off it)."""

    def __init__(self, stage: str, total: int, log_fn: StepLogger | None = None,
                 min_interval_s: float = 5.0, clock=time.monotonic, bar: bool = False):
        self.stage, self.total, self.log_fn = stage, max(1, total), log_fn
        self.artifact_id, self.failed, self.bar = None, False, bar
        try:
            from prefect.logging import get_run_logger

            self.logger = get_run_logger()
        except Exception:  # noqa: BLE001 - outside a run: the module logger
            self.logger = logging.getLogger("rlhf.progress")
        if bar:
            keep_lines_off_the_bar(self.logger)
        self.min_interval_s, self.clock = min_interval_s, clock
        self._last_write: float | None = None

    def _due(self, step: int) -> bool:
        now = self.clock()
        if step >= self.total or self._last_write is None \
                or now - self._last_write >= self.min_interval_s:
            self._last_write = now
            return True
        return False

    def _artifact(self, pct: float) -> None:
        if self.failed or not in_prefect_run():  # no API to talk to (and no temporary
            return                                # server to start)
        try:
            from prefect.artifacts import create_progress_artifact, update_progress_artifact

            if self.artifact_id is None:
                self.artifact_id = create_progress_artifact(
                    progress=pct, key=f"rlhf-{self.stage.replace('_', '-')}-progress",
                    description=f"{self.stage}: share of steps done")
            else:
                update_progress_artifact(artifact_id=self.artifact_id, progress=pct)
        except Exception:  # noqa: BLE001 - no artifact store, or a Prefect API that is gone
            self.failed = True  # its client retried for long already: not again this stage

    def __call__(self, step: int, metrics: dict[str, float] | None = None) -> None:
        metrics = metrics or {}
        if self.log_fn is not None:
            self.log_fn(step, metrics)
        pct = min(100.0, 100.0 * step / self.total)
        if self._due(step):
            self._artifact(pct)
        shown = ", ".join(f"{k}={metrics[k]:.4g}" for k in SHOWN if k in metrics)
        self.logger.info("%s: step %d/%d (%.0f%%)%s", self.stage, step, self.total, pct,
                         f" {shown}" if shown else "", extra={"rlhf_bar": self.bar})
