"""The gold judge of a run, resolved once (``eval.judge``) and read by every stage.

``auto``: the data set's own judge if it has one (the demo data does), else none; ``demo``:
the demo's judge; ``english``: the real-English task's (rlhf_core/english.py); ``none``: no
judge anywhere (no gold accuracy, no judge curves, no win rate). The judge only ever
evaluates: it never enters the reward.
"""

from __future__ import annotations

from collections.abc import Callable

Judge = Callable[[str, str, bool], float]


def resolve_judge_name(setting: str, uses_demo_data: bool) -> str:
    """``eval.judge`` -> the judge every stage uses: 'demo' or 'none'."""
    if setting == "auto":
        return "demo" if uses_demo_data else "none"
    return setting


def resolve_judge(name: str) -> Judge | None:
    """A resolved judge name -> judge(prompt, response, has_eos) -> score, or None."""
    if name == "demo":
        from rlhf_core.demo import judge_score

        return judge_score
    if name == "english":
        from rlhf_core.english import judge_score as english_score

        return english_score
    if name == "none":
        return None
    raise ValueError(f"unknown judge {name!r} (expected 'demo', 'english' or 'none')")
