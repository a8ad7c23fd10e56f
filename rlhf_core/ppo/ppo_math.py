"""PPO-for-LM equations, one function each, shapes in the docstrings. Sources (README § Sources):
[PPO], [GAE], [KL-control] (KL penalty, adaptive controller), [KL-approx] (KL estimators), [N+]
(EOS trick, temperature scaling, reward at the last token).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlhf_core.masked import masked_mean, masked_var


def logprobs_from_logits(logits: torch.Tensor, tokens: torch.Tensor,
                         temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / (T + 1e-7)) at ``tokens``: [B, T, V], [B, T] -> [B, T]. The +1e-7
    matches the sampler's scaling (README § Sources [N+], temperature)."""
    return log_softmax_at(logits, temperature).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def log_softmax_at(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / (T + 1e-7)) over the vocabulary: [B, T, V] -> [B, T, V]; the one
    pass both log-probs and entropy are taken from."""
    return F.log_softmax(logits.float() / (temperature + 1e-7), dim=-1)


def entropy_from_log_softmax(logp: torch.Tensor) -> torch.Tensor:
    """Entropy of a distribution given as log-probabilities: [B, T, V] -> [B, T]."""
    return -(logp.exp() * logp).sum(-1)


def first_true_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the first True per row, T when none: [B, T] -> [B]."""
    T = mask.shape[-1]
    idx = torch.arange(T, device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), idx, torch.full_like(idx, T)).min(dim=-1).values


def truncate_after_eos(responses: torch.Tensor, eos_id: int | list[int], pad_id: int):
    """Keep tokens up to and including the first EOS (``eos_id``: one id or a stop set); pad
    the rest. Returns (responses [B, T], response_mask [B, T] bool, has_eos [B] bool)."""
    stops = torch.tensor([eos_id] if isinstance(eos_id, int) else list(eos_id),
                         device=responses.device)
    first = first_true_index(torch.isin(responses, stops))  # (B,)
    idx = torch.arange(responses.shape[1], device=responses.device).unsqueeze(0)
    mask = idx <= first.unsqueeze(1)  # (B, T); all True when no EOS (first = T)
    out = torch.where(mask, responses, torch.full_like(responses, pad_id))
    return out, mask, first < responses.shape[1]


def last_token_index(response_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last real token per row: [B, T] -> [B]; an empty row is an error."""
    lengths = response_mask.long().sum(dim=1)  # real tokens per row
    if (lengths == 0).any():
        raise ValueError("last_token_index: a response has no real token")
    return lengths - 1


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor,
                kind: str = "k1") -> torch.Tensor:
    """Per-token KL(pi || ref) estimate on samples of pi: [B, T] -> [B, T]. k1 = log pi -
    log ref; k3 = (r - 1) - log r, r = ref/pi (README § Sources [KL-approx])."""
    if kind == "k1":
        return logprobs - ref_logprobs
    if kind == "k3":
        log_r = ref_logprobs - logprobs
        return torch.expm1(log_r) - log_r
    raise ValueError(f"unknown KL estimator {kind!r} (use 'k1' or 'k3')")


def per_token_rewards(scores: torch.Tensor, kl: torch.Tensor, response_mask: torch.Tensor,
                      kl_coef: float):
    """-beta * KL at every token plus the score at the last real token (README § Sources
    [KL-control]). Args: scores [B], kl [B, T], response_mask [B, T]. Returns (rewards,
    non_score) [B, T]."""
    mask = response_mask.bool()
    non_score = torch.where(mask, -kl_coef * kl, torch.zeros_like(kl))
    rewards = non_score.clone()
    rows = torch.arange(scores.shape[0], device=scores.device)
    rewards[rows, last_token_index(mask)] += scores.to(rewards.dtype)
    return rewards, non_score


def apply_eos_penalty(scores: torch.Tensor, has_eos: torch.Tensor,
                      penalty: float) -> torch.Tensor:
    """EOS trick: a response without EOS scores the fixed ``penalty`` (replaced): [B] -> [B]."""
    return torch.where(has_eos.bool(), scores, torch.full_like(scores, penalty))


def compute_gae(rewards: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor,
                gamma: float, lam: float):
    """Generalised advantage estimation (README § Sources [GAE]), reverse-time; the episode
    ends at the last real token. Args: [B, T] each. Returns (advantages, returns) [B, T],
    returns = A + V, 0 outside the mask."""
    mask = response_mask.to(values.dtype)
    r, v = rewards * mask, values * mask
    T = rewards.shape[1]
    last = torch.zeros_like(r[:, 0])
    adv = torch.zeros_like(r)
    for t in reversed(range(T)):
        next_v = v[:, t + 1] if t + 1 < T else torch.zeros_like(last)
        delta = r[:, t] + gamma * next_v - v[:, t]
        last = (delta + gamma * lam * last) * mask[:, t]
        adv[:, t] = last
    return adv, (adv + v) * mask


def clipped_policy_loss(logprobs, old_logprobs, advantages, mask, clip_eps: float):
    """PPO clipped surrogate, masked mean over tokens. All [B, T]; returns (loss, stats)."""
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    pg1 = -advantages * ratio
    pg2 = -advantages * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    loss = masked_mean(torch.max(pg1, pg2), mask)
    with torch.no_grad():
        stats = {"clipfrac": masked_mean((pg2 > pg1).float(), mask),
                 "approxkl": 0.5 * masked_mean(log_ratio**2, mask),
                 "ratio": masked_mean(ratio, mask),
                 "ratio_var": masked_var(ratio, mask, unbiased=False)}
    return loss, stats


def clipped_value_loss(values, old_values, returns, mask, clip_eps: float):
    """0.5 * max((V - R)^2, (V_clipped - R)^2), masked mean. All [B, T]; (loss, stats)."""
    clipped = old_values + torch.clamp(values - old_values, -clip_eps, clip_eps)
    l1, l2 = (values - returns) ** 2, (clipped - returns) ** 2
    loss = 0.5 * masked_mean(torch.max(l1, l2), mask)
    with torch.no_grad():
        stats = {"clipfrac": masked_mean((l2 > l1).float(), mask)}
    return loss, stats


def explained_variance(values, returns, mask) -> torch.Tensor:
    """1 - Var(R - V) / Var(R) over masked entries; 0 when Var(R) == 0."""
    var_r = masked_var(returns, mask, unbiased=False)
    if var_r == 0:
        return torch.tensor(0.0)
    return 1 - masked_var(returns - values, mask, unbiased=False) / var_r


class FixedKLController:
    """Constant beta."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        pass


class AdaptiveKLController(FixedKLController):
    """beta *= 1 + clip(KL/target - 1, -0.2, 0.2) * n_steps / horizon (README § Sources
    [KL-control])."""

    def __init__(self, init_kl_coef: float, target: float, horizon: int):
        super().__init__(init_kl_coef)
        self.target, self.horizon = float(target), int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon
