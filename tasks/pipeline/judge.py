"""The gold judge of a run, resolved once (``eval.judge``) and read by every stage. It only
ever evaluates (and simulates labellers): it never enters the reward."""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Judge = Callable[[str, str, bool], float]

# judge name -> the module holding its judge_score, bt_choice and clear_pairs
GOLD_JUDGES = {"demo": "rlhf_core.demo", "english": "rlhf_core.english"}


@dataclass(frozen=True)
class GoldJudge:
    """A gold judge: ``score`` an answer, ``choose`` between two as a noisy Bradley-Terry
    rater would, and make ``clear_pairs`` separated by a minimum gap."""

    name: str
    score: Judge
    choose: Callable[[str, str, str, random.Random], str]
    clear_pairs: Callable[[Sequence[str], int, float, int], list[dict]]

    def label(self, rows: Sequence[dict], seed: int, degraded: bool = False) -> list[str]:
        """A choice per pair drawn with ``seed``; ``degraded``: the side it scores lower."""
        from rlhf_core.eval.collect import judge_choices

        return judge_choices(rows, self.score, self.choose, seed, degraded)


def config_judge_name(cfg) -> str:
    """``eval.judge`` of a pipeline config -> a name of ``GOLD_JUDGES`` or 'none' (``auto``:
    the demo's data has the demo's judge, other data none)."""
    if cfg.eval.judge == "auto":
        return "demo" if cfg.demo.enabled and cfg.data is None else "none"
    return cfg.eval.judge


def gold_judge(name: str) -> GoldJudge | None:
    """A resolved judge name -> its :class:`GoldJudge`, or None for 'none'."""
    if name == "none":
        return None
    if name not in GOLD_JUDGES:
        raise ValueError(f"unknown judge {name!r} (expected one of "
                         f"{', '.join([*GOLD_JUDGES, 'none'])})")
    module = importlib.import_module(GOLD_JUDGES[name])
    return GoldJudge(name, module.judge_score, module.bt_choice, module.clear_pairs)


def resolve_judge(name: str) -> Judge | None:
    """A resolved judge name -> judge(prompt, response, has_eos) -> score, or None."""
    judge = gold_judge(name)
    return None if judge is None else judge.score
