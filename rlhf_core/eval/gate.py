"""The champion/challenger gate, pure: the challenger must pass the guard rails, and the percentile
bootstrap interval of its mean per-prompt gain (README § Sources [Bootstrap]) clear the margin.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch


def paired_bootstrap_ci(diffs: Sequence[float], confidence: float = 0.95,
                        n_bootstrap: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Mean of ``diffs`` [N] and its percentile-bootstrap interval -> (mean, low, high)."""
    d = torch.as_tensor(list(diffs), dtype=torch.float64)
    if d.numel() == 0:
        raise ValueError("paired_bootstrap_ci: no differences")
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, d.numel(), (n_bootstrap, d.numel()), generator=gen)  # [B, N]
    means = d[idx].mean(dim=1)  # [B]
    alpha = (1.0 - confidence) / 2
    low, high = torch.quantile(means, torch.tensor([alpha, 1.0 - alpha], dtype=torch.float64))
    return float(d.mean()), float(low), float(high)


def paired_win_rate(diffs: Sequence[float], confidence: float = 0.95, n_bootstrap: int = 2000,
                    seed: int = 0) -> tuple[float, float, float]:
    """Share of ``diffs`` [N] won (a tie half) and its bootstrap interval -> (rate, low, high)."""
    if not diffs:
        raise ValueError("paired_win_rate: no differences")
    wins = [1.0 if d > 0 else 0.5 if d == 0 else 0.0 for d in diffs]
    return paired_bootstrap_ci(wins, confidence, n_bootstrap, seed)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


@dataclass(frozen=True)
class GateSide:
    """One policy's answers to the held-out prompts, per prompt [N] each."""

    scores: Sequence[float]  # by the scorer both sides share
    has_eos: Sequence[bool]  # whether the response ended with EOS
    kl: Sequence[float] = ()  # KL to the reference (the challenger's is checked)


@dataclass(frozen=True)
class GateRule:
    """The decision rule's settings (as the pipeline's ``retrain.gate`` section)."""

    min_prompts: int = 200  # held-out prompts the paired test needs
    margin: float = 0.0  # the CI's lower end must exceed this score margin
    confidence: float = 0.95  # bootstrap interval level
    n_bootstrap: int = 2000  # bootstrap resamples
    max_eos_drop: float = 0.05  # the EOS rate may fall at most this much
    max_kl: float = 25.0  # cap on the challenger's KL to its reference


def gate_decision(champion: GateSide, challenger: GateSide, rule: GateRule = GateRule(), *,
                  seed: int = 0) -> dict:
    """Promote the challenger only on a significant win with no guard-rail failure ->
    {"promote": bool, "reason": str, "figures": {...}}."""
    champ, chall, r = champion.scores, challenger.scores, rule
    n = len(champ)
    if n != len(chall):
        raise ValueError(f"gate: {n} champion scores but {len(chall)} challenger scores")
    if n < r.min_prompts:
        raise ValueError(f"gate: {n} held-out prompts, the paired test needs >= "
                         f"{r.min_prompts}")
    values = [*champ, *chall, *challenger.kl]
    finite = all(math.isfinite(v) for v in values)
    eos_champ, eos_chall = _mean([float(x) for x in champion.has_eos]), \
        _mean([float(x) for x in challenger.has_eos])
    kl = _mean(challenger.kl) if finite else float("nan")
    figures = {"n_prompts": n, "score_champion": _mean(champ),
               "score_challenger": _mean(chall), "eos_rate_champion": eos_champ,
               "eos_rate_challenger": eos_chall, "kl_challenger": kl, "margin": r.margin}
    if champion.kl:  # the champion's own KL to the same reference, for comparison
        figures["kl_champion"] = _mean(champion.kl)
    if not finite:
        return {"promote": False, "reason": "guard rail: non-finite score or KL",
                "figures": figures}
    diffs = [b - a for a, b in zip(champ, chall)]
    mean, low, high = paired_bootstrap_ci(diffs, r.confidence, r.n_bootstrap, seed)
    figures.update({"diff_mean": mean, "ci_low": low, "ci_high": high})
    rate, rate_low, rate_high = paired_win_rate(diffs, r.confidence, r.n_bootstrap, seed)
    figures.update({"win_rate": rate, "win_rate_low": rate_low, "win_rate_high": rate_high})
    ci = (f"mean diff {mean:+.3f}, {r.confidence:.0%} CI [{low:+.3f}, {high:+.3f}] over {n} "
          "prompts")
    failed = []
    if eos_chall < eos_champ - r.max_eos_drop:
        failed.append(f"EOS rate {eos_chall:.3f} < champion {eos_champ:.3f} - "
                      f"{r.max_eos_drop}")
    if kl > r.max_kl:
        failed.append(f"KL to reference {kl:.3f} > cap {r.max_kl}")
    if failed:
        return {"promote": False, "reason": f"guard rail: {'; '.join(failed)} ({ci})",
                "figures": figures}
    if low > r.margin:
        return {"promote": True, "reason": f"significant win: {ci} > margin {r.margin}",
                "figures": figures}
    return {"promote": False, "reason": f"no significant win: {ci}, lower end <= margin "
            f"{r.margin}", "figures": figures}


def pair_key(row: dict) -> str:
    """A preference pair's identity: its prompt, chosen and rejected texts."""
    return json.dumps([row.get("prompt"), row.get("chosen"), row.get("rejected")],
                      sort_keys=True, ensure_ascii=False, default=str)


def held_out_for_judge(row: dict, fraction: float) -> bool:
    """Whether a preference pair belongs to the judge's held-out split, by a hash of its
    texts: stable across rounds, so PPO's reward model never sees the judge's pairs."""
    h = int.from_bytes(hashlib.sha256(pair_key(row).encode()).digest()[:8], "big")
    return h / 2.0 ** 64 < fraction
