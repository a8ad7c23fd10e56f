"""The detectors run online: :class:`HealthMonitor` records each iteration's signals and
checks, asks every watched detector, and reports each detector's first finding once. Its
state is plain JSON in PPO's checkpoints, so a resumed run watches as an unbroken one."""

from __future__ import annotations

import math
from dataclasses import asdict
from statistics import median

from pydantic import BaseModel

from rlhf_core.health.checks import CheckAnswers
from rlhf_core.health.detectors import DETECTORS, CheckRecord, Detector, Finding, History

# the per-iteration signals the detectors read (the check/* ones come with the checks)
SIGNALS = tuple(dict.fromkeys(s for d in DETECTORS for s in d.signals
                              if not s.startswith("check/")))


def check_record(answers: CheckAnswers) -> CheckRecord:
    """What the detectors may see of a check: never the gold judge."""
    n = max(len(answers.kl), 1)
    return CheckRecord(iteration=answers.iteration, proxy=list(answers.proxy),
                       judge=None if answers.judge is None else list(answers.judge),
                       kl=sum(answers.kl) / n, length=sum(answers.length) / n,
                       drift=None if answers.drift is None else median(answers.drift),
                       lengths=[float(n) for n in answers.length])


class HealthMonitor:
    """Every detector whose action is not ``off``, fed one iteration at a time."""

    def __init__(self, settings: BaseModel):
        """``settings``: the ``ppo.health`` section (one sub-section per detector)."""
        self.settings = settings
        self.watched: list[Detector] = [d for d in DETECTORS
                                        if getattr(settings, d.name).action != "off"]
        self.history = History()
        self.findings: list[Finding] = []

    def action(self, finding: Finding) -> str:
        return getattr(self.settings, finding.detector).action

    def observe(self, iteration: int, metrics: dict[str, float],
                check: CheckAnswers | None = None) -> list[Finding]:
        """Record ``iteration``'s signals (and ``check``, made after it) -> the detectors
        that fire for the first time."""
        h = self.history
        if iteration > 0:  # the start policy's check (iteration 0) has no rollout signals
            h.iterations.append(iteration)
            for name in SIGNALS:
                h.metrics.setdefault(name, [math.nan] * (len(h.iterations) - 1)).append(
                    float(metrics.get(name, math.nan)))
        if check is not None:
            h.checks.append(check_record(check))
        if iteration == 0:
            return []
        fired = {f.detector for f in self.findings}
        new = []
        for detector in self.watched:
            if detector.name in fired:
                continue
            finding = detector.rule(h, getattr(self.settings, detector.name))
            if finding is not None:
                new.append(finding)
        self.findings += new
        return new

    def standing(self) -> dict[str, str]:
        """At the end of PPO: {detector: why} for every finding that still stands."""
        out = {}
        for f in self.findings:
            d = next(d for d in DETECTORS if d.name == f.detector)
            why = None if d.stands is None else d.stands(self.history,
                                                         getattr(self.settings, d.name), f)
            if why is not None:
                out[f.detector] = why
        return out

    def best_judged_check(self) -> int | None:
        """The iteration of the check the judge scored highest (None: no judge)."""
        judged = [c for c in self.history.checks if c.judge is not None]
        if not judged:
            return None
        return max(judged, key=lambda c: sum(c.judge) / len(c.judge)).iteration

    # -- checkpoints --------------------------------------------------------------------------
    def state_dict(self) -> dict:
        h = self.history
        return {"iterations": h.iterations, "metrics": h.metrics,
                "checks": [asdict(c) for c in h.checks],
                "findings": [asdict(f) for f in self.findings]}

    def load_state_dict(self, state: dict) -> None:
        self.history = History(list(state["iterations"]),
                               {k: list(v) for k, v in state["metrics"].items()},
                               [CheckRecord(**c) for c in state["checks"]])
        self.findings = [Finding(**f) for f in state["findings"]]
