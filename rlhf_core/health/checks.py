"""Held-out checks inside PPO: every ``ppo.eval_every`` iterations the policy answers fixed
held-out prompts, scored by the proxy, an independent scorer and any gold judge, since metrics
can look fine while the outputs degrade. One sampling seed at every check makes the checks'
scores pair well; the training's random state is forked around a check, so checks change
nothing of the training.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import median

import torch

from rlhf_core.config import Sampling
from rlhf_core.eval.evaluate import sample_policy
from rlhf_core.health.drift import FeatureBasis
from rlhf_core.models.models import PPOModels, ScalarHeadModel

Gold = Callable[[str, str, bool], float]  # (prompt, response, has_eos) -> score
TextScorer = Callable[[list[str], list[str]], list[float]]  # (prompts, responses) -> scores


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else float("nan")


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
        rows = []
        for i, prompt in enumerate(prompts):
            row = {"iteration": self.iteration, "prompt": prompt,
                   "response": self.responses[i], "proxy_score": self.proxy[i],
                   "length": int(self.length[i]), "has_eos": bool(self.has_eos[i]),
                   "kl": self.kl[i]}
            if self.judge is not None:
                row["judge_score"] = self.judge[i]
            if self.gold is not None:
                row["gold_score"] = self.gold[i]
            if self.drift is not None:
                row["rm_drift"] = self.drift[i]
            rows.append(row)
        return rows


class HeldOutCheck:
    """The fixed prompts and scorers of a run's checks; :meth:`run` makes one check."""

    def __init__(self, prompts: Sequence[str], sampling: Sampling, seed: int, *,
                 judge: ScalarHeadModel | None = None, external: TextScorer | None = None,
                 gold: Gold | None = None, precision: str = "fp32"):
        """``seed``: the sampling seed of every check; the independent scorer is ``judge`` (a
        reward model) or ``external`` (a text scorer), not both; ``gold`` only evaluates."""
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
        """The policy answers every prompt, the training's random state untouched -> the
        answers and their scores."""
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
