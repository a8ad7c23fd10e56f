"""What a PPO iteration reports of its rollout batch: metrics (TRL's names where TRL has them)
and a few decoded rollouts as sample rows."""

from __future__ import annotations

from rlhf_core.masked import masked_mean
from rlhf_core.ppo.ppo_math import explained_variance
from rlhf_core.ppo.rollout import Experience, decode_responses


def rollout_metrics(exp: Experience, max_new_tokens: int, critic: bool) -> dict[str, float]:
    """The batch's objective (sums over tokens, means over the batch), response lengths, EOS
    and truncation, and with a ``critic`` the explained variance."""
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
        metrics["val/explained_variance"] = float(explained_variance(exp.values, exp.returns,
                                                                     mask))
    return metrics


def decode_rollouts(tokenizer, exp: Experience, n: int | None = None
                    ) -> tuple[list[str], list[str]]:
    """Prompt and response texts of the first n rollouts (the prompt keeps its special tokens,
    which show a chat prompt's turns)."""
    P, pad = exp.context_length, tokenizer.pad_token_id
    rows = slice(None if n is None else n)
    prompts = [tokenizer.decode(p[p != pad], skip_special_tokens=False)
               for p in exp.query_responses[rows, :P]]
    return prompts, decode_responses(tokenizer, exp.responses[rows], exp.response_mask[rows])


def sample_rows(tokenizer, exp: Experience, n: int, iteration: int) -> list[dict]:
    """The first n rollouts as table rows."""
    prompts, responses = decode_rollouts(tokenizer, exp, n)
    return [{"iteration": iteration, "prompt": prompts[i], "response": responses[i],
             "score": float(exp.raw_scores[i]), "normalised_score": float(exp.scores[i]),
             "kl": float(exp.kl[i].sum()), "has_eos": bool(exp.has_eos[i])}
            for i in range(len(prompts))]
