"""PPO watching itself: :class:`Watch` makes the held-out checks when due, feeds the detectors,
snapshots the trained weights at healthy checks (the newest ``keep_healthy`` plus the judge's
best), and says when a finding stops PPO, which then restores the last healthy snapshot.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch
from pydantic import BaseModel
from safetensors.torch import load_file, save_file

from rlhf_core.faults import crash_point
from rlhf_core.health.checks import CheckAnswers, HeldOutCheck
from rlhf_core.health.detectors import Finding
from rlhf_core.health.monitor import HealthMonitor
from rlhf_core.models.checkpoint import atomic_dir


def _trained(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters training changes (a LoRA model's adapters and heads), each once."""
    return {name: p.detach().contiguous() for name, p in model.named_parameters()
            if p.requires_grad}


@dataclass
class Verdict:
    """What one iteration's watch found: new findings, the check made (if due) and the
    finding that stops PPO (if any)."""

    iteration: int
    findings: list[Finding] = field(default_factory=list)
    check: CheckAnswers | None = None
    stop: Finding | None = None


class Watch:
    """Held-out checks every ``every`` iterations, the detectors after every iteration."""

    def __init__(self, settings: BaseModel, check: HeldOutCheck | None, every: int,
                 snapshots: str | Path | None = None):
        """``settings``: the ``ppo.health`` section; ``check`` None: rollout detectors only;
        ``snapshots`` None: nothing kept, and a stop keeps the policy as it is."""
        self.settings, self.check, self.every = settings, check, max(1, every)
        self.monitor = HealthMonitor(settings)
        self.folder = None if snapshots is None else Path(snapshots)
        self.kept: list[int] = []  # iterations of the snapshots on disk, oldest first
        self.writes = True  # False on data-parallel ranks other than 0

    # -- each iteration ---------------------------------------------------------------------------
    def due(self, iteration: int) -> bool:
        return self.check is not None and iteration % self.every == 0

    def observe(self, trainer, iteration: int, metrics: dict[str, float]) -> Verdict:
        """After ``iteration`` (0: the start policy): check when due, run the detectors,
        snapshot a healthy check."""
        verdict = Verdict(iteration)
        if self.due(iteration):
            verdict.check = self.check.run(trainer.models, trainer.tokenizer, trainer.device,
                                           iteration)
            crash_point(f"ppo:check:{iteration}")
            metrics.update(verdict.check.metrics())
        verdict.findings = self.monitor.observe(iteration, metrics, verdict.check)
        stops = [f for f in verdict.findings if self.monitor.action(f) == "stop"]
        verdict.stop = stops[0] if stops else None
        if verdict.check is not None and not verdict.findings:
            self._snapshot(trainer, iteration)
        return verdict

    # -- snapshots --------------------------------------------------------------------------------
    def _models(self, trainer) -> dict[str, torch.nn.Module]:
        models = {"policy": trainer.policy}
        if trainer.value_model is not None:
            models["value"] = trainer.value_model
        return models

    def _snapshot(self, trainer, iteration: int) -> None:
        if self.folder is None:
            return
        if self.writes:
            with atomic_dir(self.folder / f"iter_{iteration:08d}") as tmp:
                for name, model in self._models(trainer).items():
                    save_file(_trained(model), str(tmp / f"{name}.safetensors"))
        self.kept = [i for i in self.kept if i != iteration] + [iteration]
        best = self.monitor.best_judged_check()
        keep = set(self.kept[-self.settings.keep_healthy:]) | ({best} if best is not None
                                                                 else set())
        for old in [i for i in self.kept if i not in keep]:
            self.kept.remove(old)
            if self.writes:
                shutil.rmtree(self.folder / f"iter_{old:08d}", ignore_errors=True)

    def first_stop(self) -> Finding | None:
        """The first finding whose action is stop (None: none yet)."""
        return next((f for f in self.monitor.findings if self.monitor.action(f) == "stop"),
                    None)

    def restore_healthy(self, trainer, finding: Finding) -> int | None:
        """Load the newest snapshot at or before ``finding.last_healthy`` (else the oldest)
        -> its iteration, or None."""
        if self.folder is None or not self.kept or not self.writes:
            return None  # (a rank other than 0 saves no model: nothing to restore)
        eligible = [i for i in self.kept if i <= finding.last_healthy]
        chosen = max(eligible) if eligible else min(self.kept)
        path = self.folder / f"iter_{chosen:08d}"
        for name, model in self._models(trainer).items():
            tensors = load_file(str(path / f"{name}.safetensors"), device=str(trainer.device))
            missing = set(_trained(model)) - set(tensors)
            if missing:
                raise ValueError(f"healthy snapshot {path}: {name} lacks {sorted(missing)[:3]}")
            model.load_state_dict(tensors, strict=False)
        return chosen

    # -- checkpoints ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        state = {"monitor": self.monitor.state_dict(), "kept": list(self.kept)}
        if self.check is not None:
            state["check"] = self.check.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Back to a checkpoint's watch, deleting snapshots taken after it."""
        self.monitor.load_state_dict(state["monitor"])
        self.kept = list(state["kept"])
        if self.check is not None and "check" in state:
            self.check.load_state_dict(state["check"])
        if self.folder is not None and self.writes and self.folder.is_dir():
            for path in self.folder.glob("iter_*"):
                if int(path.name.removeprefix("iter_")) not in self.kept:
                    shutil.rmtree(path, ignore_errors=True)
