"""What the RL stage optimises, apart from the loop that runs it (rlhf_core/ppo/trainer.py).

An algorithm says whether a critic exists, turns scores and per-token KL into rewards and
advantages, and may add a loss term: ``gae`` is PPO with a value model (README § Sources [PPO],
[GAE], [KL-control], [N+]); the others are critic-free (rlhf_core/ppo/estimators.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlhf_core.config import PPOConfig
from rlhf_core.masked import masked_whiten
from rlhf_core.parallel.global_stats import global_masked_whiten, global_weighted_means
from rlhf_core.ppo.estimators import (
    RunningMeanBaseline,
    broadcast_to_tokens,
    grpo_advantages,
    kl_loss,
    rloo_advantages,
    sequence_rewards,
)
from rlhf_core.ppo.ppo_math import compute_gae, per_token_rewards


@dataclass
class Shaped:
    """Rewards and advantages of one rollout batch; every [B, R] tensor is 0 off the mask."""

    non_score_rewards: torch.Tensor  # (B, R) the KL penalty alone
    advantages: torch.Tensor  # (B, R)
    returns: torch.Tensor  # (B, R) value targets (zeros without a critic)


class Algorithm:
    """Base: no critic, KL as a reward penalty unless ``cfg.kl_in_loss``."""

    uses_critic = False

    def __init__(self, cfg: PPOConfig):
        self.cfg = cfg
        # data parallel: whitening and batch means use every rank's shard (all-reduced)
        self.global_batch = False

    def whiten(self, values: torch.Tensor, mask: torch.Tensor,
               shift_mean: bool = True) -> torch.Tensor:
        """``masked_whiten`` over the rollout batch (the global one under data parallel)."""
        if self.global_batch:
            return global_masked_whiten(values, mask, shift_mean=shift_mean)
        return masked_whiten(values, mask, shift_mean=shift_mean)

    def batch_mean(self, values: torch.Tensor) -> float:
        """Mean of a per-response [B] tensor over the rollout batch (global under DP)."""
        if self.global_batch:
            return global_weighted_means({"m": float(values.mean())}, len(values))["m"]
        return float(values.mean())

    @property
    def kl_in_loss(self) -> bool:
        return self.cfg.kl_in_loss

    def reward_kl_coef(self, kl_coef: float) -> float:
        """beta of the reward penalty (0 when the KL is a loss term instead)."""
        return 0.0 if self.kl_in_loss else kl_coef

    def shape(self, scores: torch.Tensor, kl: torch.Tensor, values: torch.Tensor,
              mask: torch.Tensor, kl_coef: float) -> Shaped:
        """scores [B], kl [B, R], values [B, R], mask [B, R] -> :class:`Shaped`."""
        beta = self.reward_kl_coef(kl_coef)
        non_score = per_token_rewards(scores, kl, mask, beta)[1]
        per_seq = self.sequence_advantages(sequence_rewards(scores, kl, mask, beta))
        advantages = broadcast_to_tokens(per_seq, mask)
        if self.cfg.whiten_advantages:
            advantages = self.whiten(advantages, mask) * mask
        return Shaped(non_score, advantages, torch.zeros_like(advantages))

    def sequence_advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def extra_loss(self, logprobs, ref_logprobs, mask, kl_coef: float):
        """GRPO's KL term when ``kl_in_loss`` -> (loss to add, stats); else (None, {})."""
        if not self.kl_in_loss:
            return None, {}
        loss, stats = kl_loss(logprobs, ref_logprobs, mask, "k3")
        return kl_coef * loss, stats

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class GAE(Algorithm):
    """PPO with a critic: per-token rewards, GAE, whitened advantages, value targets."""

    uses_critic = True

    def shape(self, scores, kl, values, mask, kl_coef) -> Shaped:
        rewards, non_score = per_token_rewards(scores, kl, mask, self.reward_kl_coef(kl_coef))
        if self.cfg.whiten_rewards:
            rewards = self.whiten(rewards, mask, shift_mean=False)
        advantages, returns = compute_gae(rewards, values, mask, self.cfg.gamma, self.cfg.lam)
        if self.cfg.whiten_advantages:
            advantages = self.whiten(advantages, mask) * mask
        return Shaped(non_score, advantages, returns)


class RLOO(Algorithm):
    def sequence_advantages(self, rewards):
        return rloo_advantages(rewards, self.cfg.samples_per_prompt)


class GRPO(Algorithm):
    def sequence_advantages(self, rewards):
        return grpo_advantages(rewards, self.cfg.samples_per_prompt)


class ReinforceBaseline(Algorithm):
    def __init__(self, cfg: PPOConfig):
        super().__init__(cfg)
        self.baseline = RunningMeanBaseline(cfg.baseline_momentum)

    def sequence_advantages(self, rewards):
        return self.baseline.advantages(rewards, self.batch_mean(rewards))

    def state_dict(self) -> dict:
        return {"baseline": self.baseline.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if "baseline" in state:
            self.baseline.load_state_dict(state["baseline"])


ALGORITHMS = {"gae": GAE, "rloo": RLOO, "grpo": GRPO, "reinforce_baseline": ReinforceBaseline}


def make_algorithm(cfg: PPOConfig) -> Algorithm:
    return ALGORITHMS[cfg.advantage_estimator](cfg)
