"""The PPO update's loss on one minibatch, from one forward of the policy and value model."""

from __future__ import annotations

from rlhf_core.masked import masked_mean
from rlhf_core.ppo.ppo_math import (
    clipped_policy_loss,
    clipped_value_loss,
    entropy_from_log_softmax,
    log_softmax_at,
)
from rlhf_core.ppo.rollout import response_logits, response_values


def ppo_losses(policy, value_model, qr, responses, mask, old_logprobs, advantages, old_values,
               returns, ref_logprobs, *, pad_id: int, P: int, temperature: float,
               clip_eps: float, clip_eps_value: float, vf_coef: float, ent_coef: float,
               extra_loss=None, kl_coef: float = 0.0):
    """Clipped policy loss - entropy bonus (+ clipped value loss, + ``extra_loss``) on prompt |
    response [b, P+R] -> (loss, stats)."""
    # log softmax(logits / T) once, for both the log-probs and the entropy
    logp = log_softmax_at(response_logits(policy, qr, pad_id, P), temperature)  # (b, R, V)
    logprobs = logp.gather(-1, responses.unsqueeze(-1)).squeeze(-1)
    pg_loss, pg_stats = clipped_policy_loss(logprobs, old_logprobs, advantages, mask, clip_eps)
    entropy = masked_mean(entropy_from_log_softmax(logp.detach() if ent_coef == 0 else logp),
                          mask)
    loss = pg_loss - ent_coef * entropy
    stats = {"loss/policy_avg": pg_loss, "policy/entropy_avg": entropy,
             "policy/approxkl_avg": pg_stats["approxkl"],
             "policy/clipfrac_avg": pg_stats["clipfrac"], "val/ratio": pg_stats["ratio"],
             "val/ratio_var": pg_stats["ratio_var"]}
    if value_model is not None:
        vpred = response_values(value_model, qr, pad_id, P)  # (b, R)
        vf_loss, vf_stats = clipped_value_loss(vpred, old_values, returns, mask, clip_eps_value)
        loss = loss + vf_coef * vf_loss
        stats.update({"loss/value_avg": vf_loss, "val/clipfrac_avg": vf_stats["clipfrac"]})
    if extra_loss is not None:
        extra, extra_stats = extra_loss(logprobs, ref_logprobs, mask, kl_coef)
        if extra is not None:
            loss = loss + extra
            stats.update({f"loss/{k}_avg": v for k, v in extra_stats.items()})
    return loss, stats

