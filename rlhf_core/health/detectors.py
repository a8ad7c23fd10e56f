"""The PPO failures the guides warn about, one detector each, declared once in :data:`DETECTORS`:
its name, the failure it catches, the signals it reads, its rule, its settings (thresholds and
the action, with their defaults) and the guides' advice. The rules are pure: a run's
:class:`History` in, a :class:`Finding` (or None) out. What a finding sets off (tags, events, a
stop) lives with the pipeline's tasks; ``ppo.health.<detector>`` holds each one's settings.

Each rule reads a window, never one noisy value, and compares the run with itself (its own
start, its own recent past), so one threshold holds across models and reward scales.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, Field

from rlhf_core.forms import Section

Action = Literal["warn", "stop", "off"]


class Settings(Section):
    """One detector's settings; every detector has an action."""

    action: Action = Field("warn", description="warn: record and announce; stop: also end "
                           "PPO, keeping the last healthy policy; off: not watched.")


@dataclass(frozen=True)
class CheckRecord:
    """What the detectors see of one held-out check: per-prompt proxy and judge scores [N],
    the mean KL and length and the answers' median drift from the start policy's in the
    reward model's feature space (rlhf_core/health/drift.py; never the gold judge's scores)."""

    iteration: int
    proxy: list[float]
    judge: list[float] | None
    kl: float
    length: float
    drift: float | None = None


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
    """A detector fired: at ``iteration``, its evidence beginning at ``onset``; the policy
    after ``last_healthy`` updates is the newest it does not question. With the numbers and
    one sentence saying what."""

    detector: str
    iteration: int
    onset: int
    last_healthy: int
    evidence: dict[str, float]
    message: str


def _from_rollouts(detector: str, h: History, onset: int, evidence: dict[str, float],
                   message: str) -> Finding:
    """A finding on rollout signals: iteration t's rollout was sampled by the policy after
    t - 1 updates, so the last one not in question is the policy after onset - 2."""
    return Finding(detector, h.iterations[-1], onset, max(0, onset - 2), evidence, message)


Rule = Callable[[History, Settings], Finding | None]
# at the end of PPO: why a finding still questions the final policy (None: it no longer does)
Stands = Callable[[History, Settings, Finding], str | None]


@dataclass(frozen=True)
class Detector:
    """One row of the table."""

    name: str
    failure: str  # what the guides call it
    signals: tuple[str, ...]  # the metrics it reads (check/* : the held-out checks)
    rule: Rule
    settings: type[Settings]
    advice: str
    # a finding that still stands at the end keeps the policy from becoming champion (a
    # retrain's gate excepted); None: the detector only warns
    stands: Stands | None = None


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def _finite(values: list[float]) -> bool:
    return all(math.isfinite(v) for v in values)


# -- reward hacking ----------------------------------------------------------------------------
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
    """At a check, the proxy has risen (its paired interval above 0, as the retrain gate
    judges) while the judge disagrees: since the judge's best check it has fallen by at least
    ``min_loss_share`` of its gain (its interval below that); or, since the check before, it
    has not risen (its interval reaching 0) while the KL to the reference grew ``kl_growth``
    times and ``min_kl_jump`` nats. KL and length beside it say how far the policy drifted."""
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
    """At the end of PPO: the judge's last check is still below its best one by the rule's
    margin (``min_loss_share`` of its gain, paired interval) -> why; None when the judge
    has come back (a dip it recovered from says nothing of the final policy)."""
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


# -- answers the reward model has not seen -------------------------------------------------------
class OffDistribution(Settings):
    """Owes nothing to a judge: the reward model's own features of the policy's answers."""

    max_drift: float = Field(
        1.6, gt=1, description="Fire when a check's answers lie, in the median, this many "
        "times as far from the start policy's answers in the reward model's feature space as "
        "those lie from one another (rlhf_core/health/drift.py).")


def off_distribution(h: History, s: OffDistribution) -> Finding | None:
    """At a check, the policy's answers have left what the reward model knows: their median
    whitened distance from the start policy's answers, in the reward model's own feature
    space, is ``max_drift`` times the start answers' own (README § Sources [InfoRM]: hacked
    answers are outliers there). Its scores of such answers are extrapolation, however high
    they climb."""
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


# -- KL spike ----------------------------------------------------------------------------------
class KLSpike(Settings):
    """Warns by default, and never vetoes alone: in the benchmark every run it would have
    stopped (each at the start of training, so keeping the start policy) ended better by the
    gold judge unstopped, and a KL that stays up after a fast start is the policy's new level,
    not evidence that the policy got worse."""

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


def _mean_length(h: History, start: int) -> float:
    """The mean response length (tokens, EOS included) of the iterations from ``start``;
    1 where it was not recorded (the jump is then in nats per answer)."""
    lengths = [v for v in h.series("response/length_mean")[start:] if math.isfinite(v)]
    return statistics.fmean(lengths) if lengths else 1.0


def kl_spike(h: History, s: KLSpike) -> Finding | None:
    """The KL to the reference of the rollouts jumps and stays up: ``persist`` iterations in a
    row each at least ``ratio`` times the median of the ``window`` iterations before the first
    of them (as many as there are, from the second iteration on: a policy can collapse in one
    update) and ``min_jump`` nats per response token above it."""
    kl = h.series("objective/kl")
    first = len(kl) - s.persist
    if first < 1 or not _finite(kl[first:]):
        return None
    base = _median(kl[max(0, first - s.window):first])
    jump = s.min_jump * _mean_length(h, first)
    if not math.isfinite(base) or any(v < s.ratio * base or v - base < jump
                                       for v in kl[first:]):
        return None
    return _from_rollouts("kl_spike", h, h.iterations[first],
                          {"kl": kl[-1], "kl_at_onset": kl[first], "kl_median_before": base,
                           "min_jump_nats": jump},
                          f"KL to the reference jumped to {kl[first]:.2f} from a median of "
                          f"{base:.2f} over the {s.window} iterations before and stayed up "
                          f"({kl[-1]:.2f} at iteration {h.iterations[-1]})")


# -- entropy collapse ----------------------------------------------------------------------------
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


# -- critic divergence ---------------------------------------------------------------------------
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
    """The value model stops fitting the returns: a non-finite value loss or explained
    variance at once; or, after ``warmup``, the explained variance below
    ``min_explained_variance`` for ``patience`` iterations in a row without climbing (their
    median not ``improving`` of the way from its first reading up to it) and without its
    value loss shrinking (their median above ``shrinking`` times its first), or the median value
    loss of the last ``patience`` iterations above ``growth`` times the lowest mean of any
    ``patience`` iterations before them (a median: one good iteration does not hide a critic
    that keeps failing) while the explained variance's median there is below ``fitting``."""
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


# -- flat reward ---------------------------------------------------------------------------------
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


# -- generation dominates ------------------------------------------------------------------------
class SlowRollout(Settings):
    window: int = Field(10, ge=1, description="Iterations read (after the first).")
    max_share: float = Field(0.6, gt=0, lt=1, description="Fire when the rollout takes more "
                             "than this share of the iterations' wall time.")


def slow_rollout(h: History, s: SlowRollout) -> Finding | None:
    """Generation dominates: over ``window`` iterations (the first, which warms up, aside)
    the rollout's share of rollout + update + held-out check time exceeds ``max_share``."""
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
    Detector("kl_spike", "KL spike and collapse", ("objective/kl", "response/length_mean"),
             kl_spike, KLSpike,
             "lower ppo.optim.lr, narrow ppo.clip_eps (0.1), or use ppo.adaptive_kl"),
    Detector("entropy_collapse", "entropy collapse", ("policy/entropy_avg",),
             entropy_collapse, EntropyCollapse,
             "add an entropy bonus (ppo.ent_coef), widen ppo.clip_eps, raise ppo.temperature"),
    Detector("critic_divergence", "critic divergence",
             ("loss/value_avg", "val/explained_variance"), critic_divergence,
             CriticDivergence,
             "keep ppo.whiten_advantages and the clipped value loss (ppo.clip_eps_value); "
             "check the KL-shaped per-token rewards (ppo.kl_coef, reward_norm)"),
    Detector("flat_reward", "reward never moves", ("policy/clipfrac_avg", "objective/scores"),
             flat_reward, FlatReward, "widen ppo.clip_eps"),
    Detector("slow_rollout", "generation dominates",
             ("time/rollout_s", "time/update_s", "time/check_s"), slow_rollout, SlowRollout,
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
