"""What the PPO health detectors read (:class:`History`), return (:class:`Finding`) and are
(:class:`Detector`, a row of detectors.py's table)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from pydantic import Field

from rlhf_core.section import Section

Action = Literal["warn", "stop", "off"]


class Settings(Section):
    """One detector's settings; every detector has an action."""

    action: Action = Field("warn", description="warn: record and announce; stop: also end "
                           "PPO, keeping the last healthy policy; off: not watched.")


@dataclass(frozen=True)
class CheckRecord:
    """What the detectors see of one held-out check: per-prompt proxy and judge scores [N],
    mean KL and length, and median drift; never the gold judge's scores."""

    iteration: int
    proxy: list[float]
    judge: list[float] | None
    kl: float
    length: float
    drift: float | None = None
    lengths: list[float] | None = None  # per prompt [N] (None: not recorded)


@dataclass
class History:
    """A run as the detectors read it: every iteration's signals and every check."""

    iterations: list[int] = field(default_factory=list)
    metrics: dict[str, list[float]] = field(default_factory=dict)  # signal -> per iteration
    checks: list[CheckRecord] = field(default_factory=list)

    def series(self, name: str) -> list[float]:
        """``name``'s value at each recorded iteration (NaN where it was not logged)."""
        return self.metrics.get(name, [math.nan] * len(self.iterations))

    def check_is_new(self) -> bool:
        """The last check was made at the last iteration (a check-reading rule's turn)."""
        return bool(self.checks) and bool(self.iterations) and \
            self.checks[-1].iteration == self.iterations[-1]


@dataclass(frozen=True)
class Finding:
    """A detector fired at ``iteration``, its evidence beginning at ``onset``; the policy after
    ``last_healthy`` updates is the newest it does not question."""

    detector: str
    iteration: int
    onset: int
    last_healthy: int
    evidence: dict[str, float]
    message: str


@dataclass(frozen=True)
class Detector:
    """One row of the table."""

    name: str
    failure: str  # what the guides call it
    signals: tuple[str, ...]  # the metrics it reads (check/* : the held-out checks)
    rule: Callable[[History, Settings], Finding | None]
    settings: type[Settings]
    advice: str
    # at the end of PPO: why a finding still questions the final policy (None: it no longer
    # does); one that stands keeps the policy from champion. No such rule: the finding only warns
    stands: Callable[[History, Settings, Finding], str | None] | None = None
