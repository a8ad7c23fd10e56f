"""What a PPO iteration reports: its rollout batch's metrics (TRL's names where TRL has them),
the update's averaged statistics, sample rows, and the callbacks and watch the loop calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from rlhf_core.masked import masked_mean
from rlhf_core.ppo.ppo_math import explained_variance
from rlhf_core.ppo.rollout import Experience, decode_responses

# what the loop calls out to: the caller's callbacks and a watch (rlhf_core/health/watch.py,
# a layer above); the loop knows only this protocol
# on_iteration(iteration, metrics, sample rows | None)
IterationFn = Callable[[int, dict[str, float], list[dict] | None], None]
# monitor(prompts, responses, has_eos) -> metrics on the decoded rollouts
MonitorFn = Callable[[list[str], list[str], list[bool]], dict[str, float]]
VerdictFn = Callable[[Any], None]  # on_verdict(the watch's verdict of an iteration)


class Watcher(Protocol):
    """What the loop asks of a watch: ``observe`` each iteration -> a verdict whose ``stop``
    ends PPO; ``restore_healthy`` puts the last healthy snapshot back."""

    def observe(self, trainer: Any, iteration: int, metrics: dict[str, float]) -> Any: ...

    def first_stop(self) -> Any: ...

    def restore_healthy(self, trainer: Any, finding: Any) -> int | None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


# the pre-clip gradient norm of each trained model, averaged over an iteration's steps
GRAD_NORM_KEYS = {"policy": "policy/grad_norm_avg", "value": "val/grad_norm_avg"}


def weighted_sum(pairs: list[tuple[float, torch.Tensor]], n_updates: int) -> float:
    """sum(weight * value) / n_updates over 0-d tensors, with one device sync."""
    values = torch.stack([v.float() for _, v in pairs]).cpu().tolist()
    total = 0.0
    for (weight, _), value in zip(pairs, values):
        total += value if weight == 1.0 else weight * value
    return total / n_updates


def rollout_metrics(exp: Experience, max_new_tokens: int, critic: bool) -> dict[str, float]:
    """The batch's objective (sums over tokens, means over the batch), response lengths, EOS
    and truncation; with a ``critic``, the explained variance."""
    mask = exp.response_mask
    non_score = exp.non_score_rewards.sum(1).mean()
    lengths = mask.sum(1)
    truncated = (lengths >= max_new_tokens) & ~exp.has_eos  # cut at the budget
    metrics = {
        "objective/kl": float(exp.kl.sum(1).mean()),
        "objective/entropy": float((-exp.logprobs * mask).sum(1).mean()),
        "objective/non_score_reward": float(non_score),
        "objective/rlhf_reward": float(non_score + exp.scores.mean()),
        "objective/scores": float(exp.scores.mean()),
        "objective/raw_scores": float(exp.raw_scores.mean()),
        "objective/advantage_abs_mean": float(masked_mean(exp.advantages.abs(), mask)),
        "val/num_eos_tokens": float(exp.has_eos.sum()),
        "response/length_mean": float(lengths.float().mean()),
        "response/length_max": float(lengths.max()),
        "response/truncated_rate": float(truncated.float().mean()),
        "response/eos_rate": float(exp.has_eos.float().mean()),
    }
    if critic:
        metrics["val/explained_variance"] = float(explained_variance(exp.values, exp.returns, mask))
    return metrics


def decode(tokenizer, exp: Experience, n: int | None = None) -> tuple[list[str], list[str]]:
    """Prompt and response texts of the first n rollouts (the prompt keeps its special
    tokens, which show a chat prompt's turns)."""
    P, pad, rows = exp.context_length, tokenizer.pad_token_id, slice(n)
    prompts = [tokenizer.decode(p[p != pad], skip_special_tokens=False)
               for p in exp.query_responses[rows, :P]]
    return prompts, decode_responses(tokenizer, exp.responses[rows], exp.response_mask[rows])


def sample_rows(tokenizer, exp: Experience, iteration: int, n: int) -> list[dict]:
    """The first n rollouts as table rows."""
    prompts, responses = decode(tokenizer, exp, n)
    return [{"iteration": iteration, "prompt": prompts[i], "response": responses[i],
             "score": float(exp.raw_scores[i]), "normalised_score": float(exp.scores[i]),
             "kl": float(exp.kl[i].sum()), "has_eos": bool(exp.has_eos[i])}
            for i in range(len(prompts))]
