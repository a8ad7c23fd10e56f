"""PPO watching itself: :class:`Watch` makes the held-out checks when due (fixed prompts, one
seed, the training's random state forked around them), feeds the detectors, snapshots the
trained weights at healthy checks and, when a finding stops PPO, restores the last healthy one.
A check's drift: its answers' distance from the start policy's in the reward model's feature
space, where hacked answers are outliers (README § Sources [InfoRM]). State: JSON in checkpoints.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import median

import torch
from pydantic import BaseModel
from safetensors.torch import load_file, save_file

from rlhf_core.config import Sampling
from rlhf_core.eval.evaluate import Judge, _mean, sample_policy
from rlhf_core.faults import crash_point
from rlhf_core.health.detectors import BY_NAME, DETECTORS
from rlhf_core.health.records import CheckRecord, Detector, Finding, History
from rlhf_core.models.checkpoint import atomic_dir, trained_tensors
from rlhf_core.models.models import PPOModels, ScalarHeadModel

TextScorer = Callable[[list[str], list[str]], list[float]]  # (prompts, responses) -> scores
COMPONENTS_SHARE = 0.25  # principal directions per answer of the first check


@dataclass(frozen=True)
class FeatureBasis:
    """The start answers' features: mean [H], principal directions [k, H], std along each [k]
    and their own median whitened distance (the unit of :meth:`drift`: about 1 at the start)."""

    mean: torch.Tensor
    directions: torch.Tensor
    scale: torch.Tensor
    typical: float

    @classmethod
    def fit(cls, features: torch.Tensor, share: float = COMPONENTS_SHARE) -> FeatureBasis:
        """features [N, H] (N >= 2) of the start policy's answers -> their basis."""
        if features.ndim != 2 or features.shape[0] < 2:
            raise ValueError(f"feature basis: need [N >= 2, H] features, got "
                             f"{tuple(features.shape)}")
        x = features.double()
        mean = x.mean(0)
        _, s, vh = torch.linalg.svd(x - mean, full_matrices=False)  # s [min(N, H)]
        scale = s / (x.shape[0] - 1) ** 0.5
        k = max(1, min(int(x.shape[0] * share), int((scale > 1e-8 * scale[0]).sum())))
        if scale[0] <= 0:
            raise ValueError("feature basis: the start answers' features are all the same")
        # contiguous copies: a resumed run's basis (read back from JSON) computes alike
        directions, scale = vh[:k].contiguous(), scale[:k].contiguous()
        basis = cls(mean, directions, scale, 1.0)
        return cls(mean, directions, scale, float(basis.distance(features).median()))

    def distance(self, features: torch.Tensor) -> torch.Tensor:
        """features [N, H] -> whitened distance from the start answers' mean [N]."""
        z = ((features.double() - self.mean) @ self.directions.T) / self.scale  # [N, k]
        return z.norm(dim=1)

    def drift(self, features: torch.Tensor) -> torch.Tensor:
        """features [N, H] -> each answer's distance over the start answers' median [N]."""
        return self.distance(features) / max(self.typical, 1e-12)

    # -- checkpoints: plain lists (JSON) ---------------------------------------------------------
    def state_dict(self) -> dict:
        return {"mean": self.mean.tolist(), "directions": self.directions.tolist(),
                "scale": self.scale.tolist(), "typical": self.typical}

    @classmethod
    def from_state(cls, state: dict) -> FeatureBasis:
        as_tensor = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
        return cls(as_tensor(state["mean"]), as_tensor(state["directions"]),
                   as_tensor(state["scale"]), float(state["typical"]))


@dataclass(frozen=True)
class CheckAnswers:
    """One check's answers, per prompt [N] each (``judge``/``gold`` None: no such scorer)."""

    iteration: int  # the PPO iterations done when the policy answered (0: the start policy)
    responses: list[str]
    proxy: list[float]  # the reward model's raw score
    judge: list[float] | None
    gold: list[float] | None
    length: list[int]  # response tokens, EOS included
    has_eos: list[bool]
    kl: list[float]  # KL to the reference, summed over the response
    seconds: float  # the check's wall time
    # distance from the start answers in the RM's feature space (None: not measured)
    drift: list[float] | None = None

    def metrics(self) -> dict[str, float]:
        """Means over the prompts, logged at the check's iteration."""
        out = {"check/proxy_score": _mean(self.proxy), "check/kl": _mean(self.kl),
               "check/length_mean": _mean([float(n) for n in self.length]),
               "check/eos_rate": _mean([float(e) for e in self.has_eos]),
               "check/distinct_rate": len(set(self.responses)) / max(len(self.responses), 1),
               "time/check_s": self.seconds}
        if self.judge is not None:
            out["check/judge_score"] = _mean(self.judge)
        if self.gold is not None:
            out["check/gold_score"] = _mean(self.gold)
        if self.drift is not None:
            out["check/rm_drift"] = median(self.drift)
        return out

    def rows(self, prompts: Sequence[str]) -> list[dict]:
        """One table row per prompt: the answer and its scores."""
        optional = {"judge_score": self.judge, "gold_score": self.gold, "rm_drift": self.drift}
        return [{"iteration": self.iteration, "prompt": prompt, "response": self.responses[i],
                 "proxy_score": self.proxy[i], "length": int(self.length[i]),
                 "has_eos": bool(self.has_eos[i]), "kl": self.kl[i],
                 **{key: values[i] for key, values in optional.items() if values is not None}}
                for i, prompt in enumerate(prompts)]


class HeldOutCheck:
    """The fixed prompts and scorers of a run's checks; :meth:`run` makes one check."""

    def __init__(self, prompts: Sequence[str], sampling: Sampling, seed: int, *,
                 judge: ScalarHeadModel | None = None, external: TextScorer | None = None,
                 gold: Judge | None = None, precision: str = "fp32"):
        """The independent scorer is ``judge`` (a reward model) or ``external`` (a text
        scorer), not both; ``gold`` only evaluates."""
        if not prompts:
            raise ValueError("held-out check: no prompts")
        if judge is not None and external is not None:
            raise ValueError("held-out check: a judge reward model or an external scorer, "
                             "not both")
        self.prompts, self.sampling, self.seed = list(prompts), sampling, seed
        self.judge, self.external, self.gold = judge, external, gold
        self.precision = precision
        self.basis: FeatureBasis | None = None  # the first check's answers' features

    def run(self, models: PPOModels, tokenizer, device: torch.device,
            iteration: int) -> CheckAnswers:
        """The policy answers every prompt -> the answers and their scores."""
        start = time.perf_counter()
        policy, ref_policy, _, reward_model = models
        if self.judge is not None:
            self.judge.to(device)
        cuda = [torch.cuda.current_device()] if device.type == "cuda" else []
        was_training = policy.training
        policy.eval()
        try:
            with torch.random.fork_rng(devices=cuda):
                torch.manual_seed(self.seed)
                out = sample_policy(policy, ref_policy, reward_model, tokenizer, self.prompts,
                                    self.sampling, device=device, precision=self.precision,
                                    scorers={"judge": self.judge} if self.judge else None,
                                    features=True)
        finally:
            policy.train(was_training)
        gold = None if self.gold is None else [
            float(self.gold(p, r, bool(e)))
            for p, r, e in zip(self.prompts, out["response"], out["has_eos"])]
        judged = out.get("judge")
        if self.external is not None:
            judged = [float(v) for v in self.external(self.prompts, list(out["response"]))]
            if len(judged) != len(self.prompts):
                raise ValueError(f"held-out check: the external scorer gave {len(judged)} "
                                 f"scores for {len(self.prompts)} answers")
        if self.basis is None:
            self.basis = FeatureBasis.fit(out["features"])
        drift = [float(v) for v in self.basis.drift(out["features"])]
        return CheckAnswers(
            iteration=iteration, responses=out["response"], proxy=out["score"],
            judge=judged, gold=gold, length=[int(n) for n in out["length"]],
            has_eos=[bool(e) for e in out["has_eos"]], kl=out["kl"],
            seconds=round(time.perf_counter() - start, 4), drift=drift)

    # -- checkpoints: the reference of the drift ---------------------------------------------------
    def state_dict(self) -> dict:
        return {"basis": None if self.basis is None else self.basis.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        basis = state.get("basis")
        self.basis = None if basis is None else FeatureBasis.from_state(basis)


# the per-iteration signals the detectors read (the check/* ones come with the checks)
SIGNALS = tuple(dict.fromkeys(s for d in DETECTORS for s in d.signals
                              if not s.startswith("check/")))


class HealthMonitor:
    """Every detector whose action is not ``off``, fed one iteration at a time."""

    def __init__(self, settings: BaseModel):
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
        if check is not None:  # what the detectors may see of a check: never the gold judge
            n = max(len(check.kl), 1)
            h.checks.append(CheckRecord(
                iteration=check.iteration, proxy=list(check.proxy),
                judge=None if check.judge is None else list(check.judge),
                kl=sum(check.kl) / n, length=sum(check.length) / n,
                drift=None if check.drift is None else median(check.drift),
                lengths=[float(x) for x in check.length]))
        if iteration == 0:
            return []
        fired = {f.detector for f in self.findings}
        found = (d.rule(h, getattr(self.settings, d.name)) for d in self.watched
                 if d.name not in fired)
        new = [f for f in found if f is not None]
        self.findings += new
        return new

    def standing(self) -> dict[str, str]:
        """At the end of PPO: {detector: why} for every finding that still stands."""
        out = {}
        for f in self.findings:
            d = BY_NAME[f.detector]
            why = None if d.stands is None else d.stands(self.history,
                                                         getattr(self.settings, d.name), f)
            if why is not None:
                out[f.detector] = why
        return out

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


@dataclass
class Verdict:
    """One iteration's new findings, its check (if due) and the finding that stops PPO."""

    iteration: int
    findings: list[Finding] = field(default_factory=list)
    check: CheckAnswers | None = None
    stop: Finding | None = None


class Watch:
    """Held-out checks every ``every`` iterations, the detectors after every iteration."""

    def __init__(self, settings: BaseModel, check: HeldOutCheck | None, every: int,
                 snapshots: str | Path):
        """``check`` None: rollout detectors only; ``snapshots``: the healthy snapshots' folder."""
        self.settings, self.check, self.every = settings, check, max(1, every)
        self.monitor = HealthMonitor(settings)
        self.folder = Path(snapshots)
        self.kept: list[int] = []  # iterations of the snapshots on disk, oldest first
        self.writes = True  # False on data-parallel ranks other than 0

    # -- each iteration ---------------------------------------------------------------------------
    def observe(self, trainer, iteration: int, metrics: dict[str, float]) -> Verdict:
        """After ``iteration`` (0: the start policy): check when due, run the detectors,
        snapshot a healthy check."""
        verdict = Verdict(iteration)
        if self.check is not None and iteration % self.every == 0:  # a check is due
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
    def _snapshot(self, trainer, iteration: int) -> None:
        if self.writes:
            with atomic_dir(self.folder / f"iter_{iteration:08d}") as tmp:
                for name, model in trainer.trained.items():
                    save_file(trained_tensors(model), str(tmp / f"{name}.safetensors"))
        self.kept = [i for i in self.kept if i != iteration] + [iteration]
        # the newest healthy snapshots and the one of the check the judge scored highest
        judged = [c for c in self.monitor.history.checks if c.judge is not None]
        best = [max(judged, key=lambda c: sum(c.judge) / len(c.judge)).iteration] if judged else []
        keep = set(self.kept[-self.settings.keep_healthy:] + best)
        for old in [i for i in self.kept if i not in keep]:
            self.kept.remove(old)
            if self.writes:
                shutil.rmtree(self.folder / f"iter_{old:08d}", ignore_errors=True)

    def first_stop(self) -> Finding | None:
        """The first finding whose action is stop (None: none yet)."""
        return next((f for f in self.monitor.findings if self.monitor.action(f) == "stop"), None)

    def restore_healthy(self, trainer, finding: Finding) -> int | None:
        """Load the newest snapshot at or before ``finding.last_healthy`` (else the oldest)
        -> its iteration, or None."""
        if not self.kept or not self.writes:
            return None  # (a rank other than 0 saves no model: nothing to restore)
        eligible = [i for i in self.kept if i <= finding.last_healthy]
        chosen = max(eligible) if eligible else min(self.kept)
        path = self.folder / f"iter_{chosen:08d}"
        for name, model in trainer.trained.items():
            tensors = load_file(str(path / f"{name}.safetensors"), device=str(trainer.device))
            missing = set(trained_tensors(model)) - set(tensors)
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
        if self.writes and self.folder.is_dir():
            for path in self.folder.glob("iter_*"):
                if int(path.name.removeprefix("iter_")) not in self.kept:
                    shutil.rmtree(path, ignore_errors=True)
