"""The PPO failures the guides warn about, one detector each, declared once in :data:`DETECTORS`:
its name, the failure it catches, the signals it reads, its rule, its settings (thresholds and
the action, with their defaults) and the guides' advice. The rules are pure: a run's
:class:`History` in, a :class:`Finding` (or None) out. What a finding sets off (tags, events, a
stop) lives with the pipeline's tasks; ``ppo.health.<detector>`` holds each one's settings.

Each rule reads a window, never one noisy value, and compares the run with itself (its own
start, its own recent past), so one threshold holds across models and reward scales.
"""

from __future__ import annotations

from pydantic import BaseModel

from rlhf_core.health.dynamics import (
    CriticDivergence,
    EntropyCollapse,
    FlatReward,
    KLSpike,
    SlowRollout,
    critic_divergence,
    entropy_collapse,
    flat_reward,
    kl_spike,
    slow_rollout,
)
from rlhf_core.health.hacking import (
    LengthShift,
    OffDistribution,
    RewardHacking,
    length_correlation,
    length_shift,
    length_shift_stands,
    off_distribution,
    off_distribution_stands,
    reward_hacking,
    reward_hacking_stands,
)
from rlhf_core.health.records import (
    Action,
    CheckRecord,
    Detector,
    Finding,
    History,
    Rule,
    Settings,
    Stands,
)

__all__ = ["Action", "BY_NAME", "DETECTORS", "CheckRecord", "CriticDivergence", "Detector",
           "EntropyCollapse", "Finding", "FlatReward", "History", "KLSpike", "LengthShift",
           "OffDistribution", "RewardHacking", "Rule", "Settings", "SlowRollout", "Stands",
           "critic_divergence", "entropy_collapse", "flat_reward", "for_scorer", "kl_spike",
           "length_correlation", "length_shift", "length_shift_stands", "off_distribution",
           "off_distribution_stands", "reward_hacking", "reward_hacking_stands",
           "slow_rollout"]

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
