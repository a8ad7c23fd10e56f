"""What the RL stage optimises (rlhf_core/ppo/trainer.py runs it): whether a critic exists,
scores and per-token KL into rewards and advantages, and any extra loss term. ``gae`` is PPO
with a value model (README § Sources [PPO], [GAE], [KL-control], [N+]); RLOO, GRPO (and its k3
KL loss) and REINFORCE with a running-mean baseline are critic-free ([RLOO], [GRPO],
[REINFORCE]): a batch of B = G * k responses holds k consecutive samples of each of G prompts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlhf_core.config import PPOConfig
from rlhf_core.masked import masked_mean, masked_sum
from rlhf_core.parallel.global_stats import global_masked_whiten, global_weighted_means
from rlhf_core.ppo.ppo_math import compute_gae, kl_estimate, per_token_rewards

GRPO_EPS = 1e-4  # added to the group std (README § Sources [GRPO])


def group_view(rewards: torch.Tensor, k: int, need_pairs: bool = False) -> torch.Tensor:
    """[B] -> [G, k], rows of one prompt's k samples; ``need_pairs``: k = 1 is an error."""
    if k < 1:
        raise ValueError(f"samples_per_prompt must be >= 1, got {k}")
    if need_pairs and k < 2:
        raise ValueError("this estimator compares the samples of one prompt: "
                         "ppo.samples_per_prompt must be >= 2 (got 1)")
    if rewards.dim() != 1 or rewards.shape[0] % k:
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} do not split into groups "
                         f"of {k} samples")
    return rewards.view(-1, k)


def sequence_rewards(scores: torch.Tensor, kl: torch.Tensor, response_mask: torch.Tensor,
                     kl_coef: float) -> torch.Tensor:
    """score - beta * sum_t KL_t. Args: scores [B], kl [B, T], response_mask [B, T]. Returns [B]."""
    return scores - kl_coef * masked_sum(kl, response_mask, dim=1)


def rloo_advantages(rewards: torch.Tensor, k: int) -> torch.Tensor:
    """A_i = r_i - mean_{j != i} r_j over the k samples of a prompt: [B] -> [B]."""
    groups = group_view(rewards, k, need_pairs=True)  # (G, k)
    baseline = (groups.sum(dim=1, keepdim=True) - groups) / (k - 1)  # (G, k)
    return (groups - baseline).reshape(-1)


def grpo_advantages(rewards: torch.Tensor, k: int, eps: float = GRPO_EPS) -> torch.Tensor:
    """A_i = (r_i - mean_g) / (std_g + eps), Bessel-corrected: [B] -> [B] (0 for equal r)."""
    groups = group_view(rewards, k, need_pairs=True)  # (G, k)
    mean = groups.mean(dim=1, keepdim=True)
    std = groups.std(dim=1, keepdim=True, unbiased=True)
    return ((groups - mean) / (std + eps)).reshape(-1)


class RunningMeanBaseline:
    """REINFORCE baseline b, an EMA of the batch-mean reward; ``advantages(r)`` = r - b with b
    from earlier batches (the first uses its own mean)."""

    def __init__(self, momentum: float = 0.9):
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"baseline momentum must be in [0, 1), got {momentum}")
        self.momentum = float(momentum)
        self.value: float | None = None

    def advantages(self, rewards: torch.Tensor, batch_mean: float | None = None
                   ) -> torch.Tensor:
        """[B] -> [B]. ``batch_mean``: the global batch's mean when ``rewards`` is a shard."""
        batch_mean = float(rewards.mean()) if batch_mean is None else batch_mean
        base = batch_mean if self.value is None else self.value
        out = rewards - base
        self.value = batch_mean if self.value is None else \
            self.momentum * self.value + (1.0 - self.momentum) * batch_mean
        return out

    def state_dict(self) -> dict:
        return {"momentum": self.momentum, "value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.momentum, self.value = float(state["momentum"]), state["value"]


def broadcast_to_tokens(advantages: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """One advantage per response to every real token of it: [B], [B, T] -> [B, T]."""
    return advantages.unsqueeze(1) * response_mask.to(advantages.dtype)


def kl_loss(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, response_mask: torch.Tensor):
    """GRPO's KL term: masked mean of the per-token KL(pi || ref) estimate (k3: unbiased,
    non-negative). All [B, T]; returns (loss, stats)."""
    # padding log-probs can be ~-1e9, whose exp() gives NaN gradients: set them equal first
    m = response_mask.bool()
    per_token = kl_estimate(torch.where(m, logprobs, ref_logprobs.detach()), ref_logprobs, "k3")
    loss = masked_mean(per_token, m)
    return loss, {"kl_loss": loss.detach()}


@dataclass
class Shaped:
    """Rewards and advantages of one rollout batch; every [B, R] tensor is 0 off the mask."""

    non_score_rewards: torch.Tensor  # (B, R) the KL penalty alone
    advantages: torch.Tensor  # (B, R)
    returns: torch.Tensor  # (B, R) value targets (zeros without a critic)


class Algorithm:
    """Base: no critic, KL as a reward penalty unless ``cfg.kl_in_loss``. Whitening and batch
    means cover the rollout batch: under data parallelism, every rank's shard."""

    uses_critic = False

    def __init__(self, cfg: PPOConfig):
        self.cfg = cfg

    def reward_kl_coef(self, kl_coef: float) -> float:
        """beta of the reward penalty (0 when the KL is a loss term instead)."""
        return 0.0 if self.cfg.kl_in_loss else kl_coef

    def shape(self, scores: torch.Tensor, kl: torch.Tensor, values: torch.Tensor,
              mask: torch.Tensor, kl_coef: float) -> Shaped:
        """scores [B], kl [B, R], values [B, R], mask [B, R] -> :class:`Shaped`."""
        beta = self.reward_kl_coef(kl_coef)
        non_score = per_token_rewards(scores, kl, mask, beta)[1]
        per_seq = self.sequence_advantages(sequence_rewards(scores, kl, mask, beta))
        advantages = broadcast_to_tokens(per_seq, mask)
        if self.cfg.whiten_advantages:
            advantages = global_masked_whiten(advantages, mask) * mask
        return Shaped(non_score, advantages, torch.zeros_like(advantages))

    def sequence_advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def extra_loss(self, logprobs, ref_logprobs, mask, kl_coef: float):
        """GRPO's KL term when ``kl_in_loss`` -> (loss to add, stats); else (None, {})."""
        if not self.cfg.kl_in_loss:
            return None, {}
        loss, stats = kl_loss(logprobs, ref_logprobs, mask)
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
            rewards = global_masked_whiten(rewards, mask, shift_mean=False)
        advantages, returns = compute_gae(rewards, values, mask, self.cfg.gamma, self.cfg.lam)
        if self.cfg.whiten_advantages:
            advantages = global_masked_whiten(advantages, mask) * mask
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
        batch_mean = global_weighted_means({"m": float(rewards.mean())}, len(rewards))["m"]
        return self.baseline.advantages(rewards, batch_mean)

    def state_dict(self) -> dict:
        return {"baseline": self.baseline.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if "baseline" in state:
            self.baseline.load_state_dict(state["baseline"])


ALGORITHMS = {"gae": GAE, "rloo": RLOO, "grpo": GRPO, "reinforce_baseline": ReinforceBaseline}


def make_algorithm(cfg: PPOConfig) -> Algorithm:
    return ALGORITHMS[cfg.advantage_estimator](cfg)
