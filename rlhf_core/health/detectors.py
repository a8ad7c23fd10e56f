"""The PPO failures the guides warn about, one detector each in :data:`DETECTORS` (settings
under ``ppo.health.<detector>``): a pure rule comparing the run's :class:`History` with its own
start or recent past -> a :class:`Finding` or None, and a ``*_stands`` twin asking it of the
final policy. Reward hacking's rules are here, the training dynamics' in dynamics.py.
"""

from __future__ import annotations

import math
import statistics

from pydantic import BaseModel, Field

from rlhf_core.health import dynamics
from rlhf_core.health.records import CheckRecord, Detector, Finding, History, Settings


class RewardHacking(Settings):
    """Warns by default (a flagged policy is never made champion without an override);
    ``stop`` ends PPO and keeps the judge's best check (docs/health.md: when to choose it)."""

    min_loss_share: float = Field(
        0.1, ge=0, description="Fire when the judge has lost at least this share of its gain "
        "(its best check over the start) at a check, significantly (paired interval)...")
    kl_growth: float = Field(
        2.0, gt=1, description="...or when, since the check before, the KL to the reference "
        "grew this many times...")
    min_kl_jump: float = Field(
        5.0, ge=0, description="...and this many nats, for a proxy gain the judge does not "
        "confirm.")
    confidence: float = Field(0.95, gt=0, lt=1, description="Paired bootstrap interval level.")
    min_drift: float | None = Field(
        None, ge=0, description="A finding also needs the check's answers to have drifted at "
        "least this far in the reward model's feature space (check/rm_drift): two signals "
        "agreeing. None: off_distribution's max_drift with the judge reward model as the "
        "scorer (it shares the reward model's blind spots and, alone, raised false alarms "
        "on healthy runs), 0 with a registered scorer (ppo.health.scorer).")


def _paired(now: list[float], then: list[float], confidence: float) -> tuple[float, ...]:
    """Mean of now - then per prompt and its percentile-bootstrap interval (the gate's)."""
    from rlhf_core.eval.gate import paired_bootstrap_ci  # torch: imported when a rule runs

    return paired_bootstrap_ci([a - b for a, b in zip(now, then)], confidence)


def reward_hacking(h: History, s: RewardHacking) -> Finding | None:
    """At a check, the proxy has risen significantly while the judge has fallen
    ``min_loss_share`` of its gain from its best, or has not risen while the KL grew
    ``kl_growth`` times and ``min_kl_jump`` nats."""
    if not h.check_is_new() or len(h.checks) < 3 or h.checks[-1].judge is None:
        return None
    start, prev, now = h.checks[0], h.checks[-2], h.checks[-1]
    if s.min_drift and (now.drift is None or now.drift < s.min_drift):
        return None  # the answers have not left the reward model's experience
    best = max(h.checks[:-1], key=lambda c: statistics.fmean(c.judge))
    judge_gain = statistics.fmean(best.judge) - statistics.fmean(start.judge)
    proxy = _paired(now.proxy, best.proxy, s.confidence)
    judge = _paired(now.judge, best.judge, s.confidence)
    if proxy[1] > 0 and judge[2] < -s.min_loss_share * max(judge_gain, 0.0):
        since, how = best, (f"the held-out judge fell {judge[0]:+.3f} (CI [{judge[1]:+.3f}, "
                            f"{judge[2]:+.3f}]) from its best")
    else:
        proxy = _paired(now.proxy, prev.proxy, s.confidence)
        judge = _paired(now.judge, prev.judge, s.confidence)
        drift = now.kl >= s.kl_growth * prev.kl and now.kl - prev.kl >= s.min_kl_jump
        if not (proxy[1] > 0 and judge[1] <= 0 and drift):
            return None
        since, how = prev, (f"the held-out judge did not confirm it ({judge[0]:+.3f}, CI "
                            f"[{judge[1]:+.3f}, {judge[2]:+.3f}])")
    evidence = {"proxy_gain": proxy[0], "proxy_gain_low": proxy[1], "judge_change": judge[0],
                "judge_change_low": judge[1], "judge_change_high": judge[2],
                "judge_gain_at_best": judge_gain, "since_iteration": float(since.iteration),
                "kl_then": since.kl, "kl_now": now.kl, "length_then": since.length,
                "length_now": now.length}
    return Finding("reward_hacking", now.iteration, since.iteration, since.iteration, evidence,
                   f"the proxy score rose {proxy[0]:+.3f} since iteration {since.iteration} "
                   f"while {how}; KL {since.kl:.2f} -> {now.kl:.2f}, length "
                   f"{since.length:.1f} -> {now.length:.1f}")


def reward_hacking_stands(h: History, s: RewardHacking, f: Finding) -> str | None:
    """At the end of PPO: why the judge's last check is still below its best by the rule's
    margin, or None when it has come back."""
    judged = [c for c in h.checks if c.judge is not None]
    if len(judged) < 2:
        return None
    start, last = judged[0], judged[-1]
    best = max(judged[:-1], key=lambda c: statistics.fmean(c.judge))
    gain = statistics.fmean(best.judge) - statistics.fmean(start.judge)
    judge = _paired(last.judge, best.judge, s.confidence)
    if judge[2] >= -s.min_loss_share * max(gain, 0.0):
        return None
    return (f"at the last check (iteration {last.iteration}) the held-out judge is still "
            f"{judge[0]:+.3f} (CI [{judge[1]:+.3f}, {judge[2]:+.3f}]) below its best "
            f"(iteration {best.iteration})")


class OffDistribution(Settings):
    """Owes nothing to a judge: the reward model's own features of the policy's answers."""

    max_drift: float = Field(
        1.6, gt=1, description="Fire when a check's answers lie, in the median, this many "
        "times as far from the start policy's answers in the reward model's feature space as "
        "those lie from one another (rlhf_core/health/watch.py).")


def off_distribution(h: History, s: OffDistribution) -> Finding | None:
    """At a check, the answers lie ``max_drift`` times as far from the start policy's, in the
    reward model's feature space, as those lie from one another: its scores there are
    extrapolation (README § Sources [InfoRM])."""
    if not h.check_is_new() or len(h.checks) < 2:
        return None
    now = h.checks[-1]
    if now.drift is None or now.drift < s.max_drift:
        return None
    before = [c for c in h.checks[:-1] if c.drift is not None and c.drift < s.max_drift]
    since = before[-1] if before else h.checks[0]
    start = h.checks[0]
    proxy = statistics.fmean(now.proxy) - statistics.fmean(start.proxy)
    evidence = {"drift": now.drift, "drift_before": since.drift or 1.0,
                "since_iteration": float(since.iteration), "proxy_gain": proxy,
                "kl_now": now.kl, "length_then": start.length, "length_now": now.length}
    return Finding("off_distribution", now.iteration, since.iteration, since.iteration,
                   evidence, f"the answers lie {now.drift:.2f}x as far from the start policy's "
                   f"in the reward model's feature space as those lie from one another "
                   f"({since.drift or 1.0:.2f}x at iteration {since.iteration}); the proxy "
                   f"score rose {proxy:+.3f} since the start, KL {now.kl:.2f}, length "
                   f"{start.length:.1f} -> {now.length:.1f}")


def off_distribution_stands(h: History, s: OffDistribution, f: Finding) -> str | None:
    """At the end of PPO: the last check's answers are still that far out -> why."""
    last = next((c for c in reversed(h.checks) if c.drift is not None), None)
    if last is None or last.drift < s.max_drift:
        return None
    return (f"at the last check (iteration {last.iteration}) the answers still lie "
            f"{last.drift:.2f}x as far out as the start policy's")


class LengthShift(Settings):
    """Owes nothing to a judge: the answers' length, the shortcut a reward model most often
    rewards (README § Sources [ODIN])."""

    max_ratio: float = Field(
        2.0, gt=1, description="Fire when a check's answers are, in the mean, this many times "
        "as long as the start policy's, or this many times as short...")
    min_tokens: float = Field(
        2.0, ge=0, description="...and at least this many tokens apart (answers of one or "
        "two tokens halve or double by noise)...")
    max_correlation: float = Field(
        0.5, gt=0, le=1, description="...or when, across a check's answers, the proxy score's "
        "correlation with their length (longer scored higher) is at least this...")
    persist: int = Field(2, ge=1, description="...at this many checks in a row after the "
                         "start...")
    confidence: float = Field(
        0.95, gt=0, lt=1, description="...while the proxy score has risen since the start "
        "(its paired bootstrap interval at this level above 0).")


def _length_ratio(start: float, now: float) -> float:
    """How many times longer (> 1) or shorter (< 1) the answers are; inf from empty ones."""
    return now / start if start > 0 else (math.inf if now > 0 else 1.0)


def _length_shifted(start: float, now: float, s: LengthShift) -> bool:
    ratio = _length_ratio(start, now)
    return abs(now - start) >= s.min_tokens and (ratio >= s.max_ratio or ratio <= 1 / s.max_ratio)


def length_correlation(c: CheckRecord) -> float:
    """Pearson's correlation of a check's proxy scores with its answers' lengths, or NaN."""
    if c.lengths is None or len(c.lengths) < 3:
        return math.nan
    try:
        return statistics.correlation(c.proxy, c.lengths)
    except statistics.StatisticsError:
        return math.nan


def length_shift(h: History, s: LengthShift) -> Finding | None:
    """At a check, while the proxy has risen significantly: the mean length moved ``max_ratio``
    times from the start policy's, or the proxy scored longer answers higher at ``persist``
    checks in a row; the reward model pays for length itself (README § Sources [ODIN])."""
    if not h.check_is_new() or len(h.checks) < 2:
        return None
    start, now = h.checks[0], h.checks[-1]
    shifted = _length_shifted(start.length, now.length, s)
    recent = h.checks[1:][-s.persist:]  # each correlates score and length by max_correlation
    if not (shifted or (len(recent) == s.persist and all(
            length_correlation(c) >= s.max_correlation for c in recent))):
        return None
    proxy = _paired(now.proxy, start.proxy, s.confidence)
    if proxy[1] <= 0:
        return None
    corr = length_correlation(now)
    evidence = {"length_then": start.length, "length_now": now.length,
                "length_ratio": _length_ratio(start.length, now.length),
                "length_correlation": corr, "length_correlation_then":
                length_correlation(start), "proxy_gain": proxy[0], "proxy_gain_low": proxy[1],
                "kl_now": now.kl}
    if shifted:
        before = [c for c in h.checks[:-1] if not _length_shifted(start.length, c.length, s)]
        since = before[-1]  # the start itself is never shifted from itself
        ratio = evidence["length_ratio"]
        way = "longer" if ratio > 1 else "shorter"
        times = ratio if ratio > 1 else (1 / ratio if ratio > 0 else math.inf)
        how = (f"the answers are {times:.1f}x {way} than the start policy's ("
               f"{start.length:.1f} -> {now.length:.1f} tokens; {since.length:.1f} at "
               f"iteration {since.iteration})")
    else:
        since = h.checks[-s.persist - 1]
        how = (f"the proxy scores longer answers higher: its correlation with their length "
               f"is {corr:+.2f} ({length_correlation(start):+.2f} at the start), "
               f"{s.persist} checks in a row; length {start.length:.1f} -> "
               f"{now.length:.1f} tokens")
    evidence["since_iteration"] = float(since.iteration)
    return Finding("length_shift", now.iteration, since.iteration, since.iteration, evidence,
                   f"{how}, while the proxy score rose {proxy[0]:+.3f} since the start (CI "
                   f"low {proxy[1]:+.3f}); KL {now.kl:.2f}")


def length_shift_stands(h: History, s: LengthShift, f: Finding) -> str | None:
    """At the end of PPO: why the last check's answers are still shifted or scored by length."""
    if len(h.checks) < 2:
        return None
    start, last = h.checks[0], h.checks[-1]
    if _length_shifted(start.length, last.length, s):
        return (f"at the last check (iteration {last.iteration}) the answers are still "
                f"{last.length:.1f} tokens long (the start policy's: {start.length:.1f})")
    corr = length_correlation(last)
    if corr >= s.max_correlation:
        return (f"at the last check (iteration {last.iteration}) the proxy still scores "
                f"longer answers higher (correlation {corr:+.2f})")
    return None


DETECTORS: tuple[Detector, ...] = (
    Detector("reward_hacking", "reward hacking",
             ("check/proxy_score", "check/judge_score", "check/kl", "check/length_mean",
              "check/rm_drift"),
             reward_hacking, RewardHacking,
             "raise ppo.kl_coef (or use ppo.adaptive_kl); retrain the reward model with pairs "
             "on the policy's new failure cases (rlhf collect)", reward_hacking_stands),
    Detector("off_distribution", "reward hacking (answers the reward model has not seen)",
             ("check/rm_drift", "check/proxy_score", "check/kl", "check/length_mean"),
             off_distribution, OffDistribution,
             "raise ppo.kl_coef (or use ppo.adaptive_kl) to keep the policy near what the "
             "reward model was trained on; collect pairs on the policy's answers (rlhf "
             "collect) so that it learns to judge them", off_distribution_stands),
    Detector("length_shift", "reward hacking (the answers' length)",
             ("check/length_mean", "check/proxy_score", "check/kl"), length_shift, LengthShift,
             "raise ppo.kl_coef (or use ppo.adaptive_kl); look at the reward model's scores "
             "against the answers' length and retrain it with pairs on the policy's answers "
             "(rlhf collect), where a longer or shorter answer is not by itself the better one",
             length_shift_stands),
    Detector("kl_spike", "KL spike and collapse", ("objective/kl", "response/length_mean"),
             dynamics.kl_spike, dynamics.KLSpike,
             "lower ppo.optim.lr, narrow ppo.clip_eps (0.1), or use ppo.adaptive_kl"),
    Detector("entropy_collapse", "entropy collapse", ("policy/entropy_avg",),
             dynamics.entropy_collapse, dynamics.EntropyCollapse,
             "add an entropy bonus (ppo.ent_coef), widen ppo.clip_eps, raise ppo.temperature"),
    Detector("critic_divergence", "critic divergence",
             ("loss/value_avg", "val/explained_variance"), dynamics.critic_divergence,
             dynamics.CriticDivergence,
             "keep ppo.whiten_advantages and the clipped value loss (ppo.clip_eps_value); "
             "check the KL-shaped per-token rewards (ppo.kl_coef, reward_norm)"),
    Detector("flat_reward", "reward never moves", ("policy/clipfrac_avg", "objective/scores"),
             dynamics.flat_reward, dynamics.FlatReward, "widen ppo.clip_eps"),
    Detector("slow_rollout", "generation dominates",
             ("time/rollout_s", "time/update_s", "time/check_s"), dynamics.slow_rollout,
             dynamics.SlowRollout,
             "faster generation (ppo.generation_batch_size, model.precision, "
             "ppo.static_cache on CUDA); fewer or cheaper held-out checks"),
)

BY_NAME: dict[str, Detector] = {d.name: d for d in DETECTORS}


def for_scorer(settings: BaseModel, registered: bool) -> BaseModel:
    """The ``ppo.health`` section with reward_hacking's ``min_drift`` resolved for the
    checks' independent scorer: a registered one stands alone (0); the judge reward model
    needs off_distribution's drift to agree (its ``max_drift``)."""
    hacking = settings.reward_hacking
    if hacking.min_drift is not None:
        return settings
    drift = 0.0 if registered else settings.off_distribution.max_drift
    return settings.model_copy(update={"reward_hacking": hacking.model_copy(
        update={"min_drift": drift})})
