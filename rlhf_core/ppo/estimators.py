"""Critic-free advantage estimators: RLOO, GRPO and REINFORCE with a running-mean baseline.

A batch of B = G * k responses holds k consecutive samples of each of G prompts; each estimator
turns rewards [B] into advantages [B], applied to every real token of the response. Sources
(README § Sources): [RLOO], [GRPO] (and its k3 KL loss term), [REINFORCE].
"""

from __future__ import annotations

import torch

from rlhf_core.masked import masked_mean, masked_sum
from rlhf_core.ppo.ppo_math import kl_estimate

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
    """score - beta * sum_t KL_t. Args: scores [B], kl [B, T], response_mask [B, T].
    Returns [B]."""
    return scores - kl_coef * masked_sum(kl, response_mask, dim=1)


def rloo_advantages(rewards: torch.Tensor, k: int) -> torch.Tensor:
    """A_i = r_i - mean_{j != i} r_j over the k samples of a prompt: [B] -> [B]."""
    groups = group_view(rewards, k, need_pairs=True)  # (G, k)
    baseline = (groups.sum(dim=1, keepdim=True) - groups) / (k - 1)  # (G, k)
    return (groups - baseline).reshape(-1)


def grpo_advantages(rewards: torch.Tensor, k: int, eps: float = GRPO_EPS) -> torch.Tensor:
    """A_i = (r_i - mean_g) / (std_g + eps), Bessel-corrected std: [B] -> [B] (0 for a group
    of equal rewards)."""
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


def kl_loss(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, response_mask: torch.Tensor,
            kind: str = "k3"):
    """GRPO's KL term: masked mean of the per-token KL(pi || ref) estimate (k3: unbiased,
    non-negative). All [B, T]; returns (loss, stats)."""
    # padding log-probs can be ~-1e9, whose exp() gives NaN gradients: set them equal first
    m = response_mask.bool()
    per_token = kl_estimate(torch.where(m, logprobs, ref_logprobs.detach()), ref_logprobs, kind)
    loss = masked_mean(per_token, m)
    return loss, {"kl_loss": loss.detach()}
