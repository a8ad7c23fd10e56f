"""The training dynamics' detectors: rules on every iteration's rollout and update signals
(KL, entropy, the critic's fit, the reward's progress, the time generation takes)."""

from __future__ import annotations

import math
import statistics

from pydantic import Field

from rlhf_core.health.records import Finding, History, Settings


def _from_rollouts(detector: str, h: History, onset: int, evidence: dict[str, float],
                   message: str) -> Finding:
    """A finding on rollout signals: iteration t's rollout was sampled by the policy after
    t - 1 updates, so the last one not in question is the policy after onset - 2."""
    return Finding(detector, h.iterations[-1], onset, max(0, onset - 2), evidence, message)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def _finite(values: list[float]) -> bool:
    return all(math.isfinite(v) for v in values)


class KLSpike(Settings):
    """Warns by default and never vetoes alone: a KL that stays up after a fast start is the
    policy's new level, not evidence that it got worse."""

    window: int = Field(5, ge=1, description="Iterations before whose median KL is the "
                        "baseline (fewer at the start of a run).")
    ratio: float = Field(3.0, gt=1, description="Fire when KL reaches this many times the "
                         "median of the window before it...")
    min_jump: float = Field(1.0, ge=0, description="...and at least this many nats per "
                            "response token above it (times the iterations' mean response "
                            "length: the floor of a spike at the start, where the median is "
                            "0, and a scale that carries to longer answers)...")
    persist: int = Field(2, ge=1, description="...for this many iterations in a row (a single "
                         "iteration's jump that falls back is noise).")


def kl_spike(h: History, s: KLSpike) -> Finding | None:
    """The rollouts' KL to the reference jumps and stays up: ``persist`` iterations in a row
    at least ``ratio`` times the median of the ``window`` before and ``min_jump`` nats per
    response token above it."""
    kl = h.series("objective/kl")
    first = len(kl) - s.persist
    if first < 1 or not _finite(kl[first:]):
        return None
    base = _median(kl[max(0, first - s.window):first])
    lengths = [v for v in h.series("response/length_mean")[first:] if math.isfinite(v)]
    jump = s.min_jump * (statistics.fmean(lengths) if lengths else 1.0)  # 1: not recorded
    if not math.isfinite(base) or any(v < s.ratio * base or v - base < jump
                                       for v in kl[first:]):
        return None
    return _from_rollouts("kl_spike", h, h.iterations[first],
                          {"kl": kl[-1], "kl_at_onset": kl[first], "kl_median_before": base,
                           "min_jump_nats": jump},
                          f"KL to the reference jumped to {kl[first]:.2f} from a median of "
                          f"{base:.2f} over the {s.window} iterations before and stayed up "
                          f"({kl[-1]:.2f} at iteration {h.iterations[-1]})")


class EntropyCollapse(Settings):
    share: float = Field(0.05, gt=0, lt=1, description="Fire when the per-token entropy stays "
                         "below this share of its first iterations' highest...")
    patience: int = Field(5, ge=1, description="...for this many iterations in a row.")


def entropy_collapse(h: History, s: EntropyCollapse) -> Finding | None:
    """The policy's per-token entropy falls towards zero: below ``share`` of its highest over
    the first ``patience`` iterations, for ``patience`` iterations in a row."""
    ent = h.series("policy/entropy_avg")
    if len(ent) <= s.patience:
        return None
    start = max(ent[:s.patience])
    recent = ent[-s.patience:]
    if not _finite([start, *recent]):
        return None
    if not all(v < s.share * start for v in recent):
        return None
    onset = h.iterations[-s.patience]
    return _from_rollouts("entropy_collapse", h, onset,
                          {"entropy": recent[-1], "entropy_at_start": start},
                   f"per-token entropy {recent[-1]:.4f} has stayed below {s.share:.0%} of its "
                   f"start ({start:.4f}) since iteration {onset}")


class CriticDivergence(Settings):
    warmup: int = Field(1, ge=0, description="First iterations not read (a critic warm-started "
                        "from the reward model explains little of its first returns).")
    patience: int = Field(4, ge=1, description="Iterations a sign must hold.")
    min_explained_variance: float = Field(
        0.1, description="Fire when the explained variance stays below this (a critic that "
        "explains almost none of the returns: a fitting one passes it within a few "
        "iterations)...")
    improving: float = Field(
        0.25, ge=0, le=1, description="...unless, never above it yet, its median there has "
        "closed this share of the gap from its first reading (the warm start's) up to it (a "
        "critic warm-started far from the returns, as a real model's reward model puts it, "
        "still climbing)...")
    shrinking: float = Field(
        0.5, gt=0, le=1, description="...or its value loss's median there is at most this "
        "share of its first reading (a critic that never fitted whose error keeps shrinking "
        "is fitting: the explained variance divides by the returns' variance, which falls as "
        "a real model's rewards settle)...")
    growth: float = Field(4.0, gt=1, description="...or the value loss's median over the "
                          "last iterations is above this many times its lowest mean before...")
    fitting: float = Field(0.5, description="...while the explained variance's median there "
                           "is below this (a critic that still explains most of the returns "
                           "is fitting a larger target, e.g. after the adaptive KL controller "
                           "moved the rewards, not diverging).")


def critic_divergence(h: History, s: CriticDivergence) -> Finding | None:
    """The value model stops fitting the returns: a non-finite value loss, or after ``warmup``
    a low explained variance that is neither climbing nor shrinking its loss, or a median
    value loss ``growth`` times its lowest while the explained variance is below ``fitting``."""
    loss, ev = h.series("loss/value_avg"), h.series("val/explained_variance")
    if not loss or all(math.isnan(v) for v in loss):
        return None  # no critic
    t, n = h.iterations[-1], s.patience
    if not _finite([loss[-1], ev[-1]]):
        return _from_rollouts("critic_divergence", h, t, {"value_loss": loss[-1],
                                                          "explained_variance": ev[-1]},
                              f"non-finite value loss {loss[-1]} / explained variance {ev[-1]}")
    if len(loss) < s.warmup + n:
        return None
    recent_loss, recent_ev = loss[-n:], ev[-n:]
    onset = h.iterations[-n]
    first, floor = ev[0], s.min_explained_variance  # the warm start's own reading
    # a critic that never fitted yet and is climbing from its warm start is still fitting
    never = all(v < floor for v in ev)
    climbing = never and _median(recent_ev) >= first + s.improving * (floor - first)
    shrinking = never and _median(recent_loss) <= s.shrinking * loss[0]
    if all(v < floor for v in recent_ev) and not (climbing or shrinking):
        return _from_rollouts("critic_divergence", h, onset,
                              {"explained_variance": recent_ev[-1], "value_loss": recent_loss[-1]},
                              f"explained variance below {s.min_explained_variance:g} for {n} "
                              f"iterations (now {recent_ev[-1]:.3f})")
    if len(loss) < s.warmup + 2 * n:
        return None
    lowest = min(statistics.fmean(loss[i:i + n]) for i in range(s.warmup, len(loss) - 2 * n + 1))
    median = _median(recent_loss)
    if median > s.growth * lowest and _median(recent_ev) < s.fitting:
        return _from_rollouts("critic_divergence", h, onset,
                              {"value_loss_median": median, "value_loss_lowest": lowest},
                              f"the value loss's median over {n} iterations, {median:.4g}, is "
                              f"{median / lowest:.1f}x its lowest mean ({lowest:.4g})")
    return None


class FlatReward(Settings):
    window: int = Field(10, ge=2, description="Iterations read.")
    clip_share: float = Field(0.25, gt=0, le=1, description="Fire when the policy clip fraction "
                              "averages at least this over the window...")
    min_gain: float = Field(0.1, ge=0, description="...and the mean score of its second half "
                            "is less than this above its first half's.")


def flat_reward(h: History, s: FlatReward) -> Finding | None:
    """The reward never moves: over ``window`` iterations the policy clip fraction is
    saturated (at least ``clip_share`` on average) and the score does not rise."""
    clip, score = h.series("policy/clipfrac_avg"), h.series("objective/scores")
    if len(clip) < s.window:
        return None
    clip_w, score_w = clip[-s.window:], score[-s.window:]
    if not _finite(clip_w + score_w):
        return None
    half = s.window // 2
    gain = statistics.fmean(score_w[half:]) - statistics.fmean(score_w[:half])
    mean_clip = statistics.fmean(clip_w)
    if mean_clip < s.clip_share or gain >= s.min_gain:
        return None
    onset = h.iterations[-s.window]
    return _from_rollouts("flat_reward", h, onset, {"clipfrac": mean_clip, "score_gain": gain},
                   f"clip fraction {mean_clip:.2f} over {s.window} iterations while the score "
                   f"moved {gain:+.3f}")


class SlowRollout(Settings):
    window: int = Field(10, ge=1, description="Iterations read (after the first).")
    max_share: float = Field(0.6, gt=0, lt=1, description="Fire when the rollout takes more "
                             "than this share of the iterations' wall time.")


def slow_rollout(h: History, s: SlowRollout) -> Finding | None:
    """Generation dominates: over ``window`` iterations after the first, the rollout's share
    of the wall time exceeds ``max_share``."""
    roll, upd = h.series("time/rollout_s"), h.series("time/update_s")
    check = [0.0 if math.isnan(v) else v for v in h.series("time/check_s")]
    if len(roll) < s.window + 1:
        return None
    if not _finite(roll[-s.window:] + upd[-s.window:]):
        return None
    r = sum(roll[-s.window:])
    total = r + sum(upd[-s.window:]) + sum(check[-s.window:])
    share = r / total if total > 0 else 0.0
    if share <= s.max_share:
        return None
    return _from_rollouts("slow_rollout", h, h.iterations[-s.window],
                          {"rollout_share": share},
                   f"the rollout took {share:.0%} of the last {s.window} iterations' time")
