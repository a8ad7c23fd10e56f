"""PPO rollout: generate, score, and turn scores into per-token advantages. A batch is
``query_responses [B, P + R]``: left-padded prompt, then the response (pad after the first
EOS). Old log-probs come from the generation logits in fp32, else from the update's own forward
(``recompute_logprobs``), so the ratio before any update is 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import GenerationConfig

from rlhf_core.models.chat import stop_token_ids
from rlhf_core.models.models import PPOModels, ScalarHeadModel, position_ids_from_mask
from rlhf_core.models.sampling import fits_lean_loop, sample_responses
from rlhf_core.models.scoring import gather_at, normalise_scores
from rlhf_core.ppo.algorithms import Algorithm
from rlhf_core.ppo.ppo_math import (
    apply_eos_penalty,
    kl_estimate,
    last_token_index,
    logprobs_from_logits,
    truncate_after_eos,
)
from rlhf_core.ppo.rewards import (
    RewardMix,
    call_scorer,
    checked_scores,
    combine,
    scored_rows,
    source_metrics,
)


@dataclass
class Experience:
    """One rollout batch; every [B, R] tensor is 0 outside ``response_mask``."""

    query_responses: torch.Tensor  # (B, P+R) prompt | response, long
    context_length: int  # P
    responses: torch.Tensor  # (B, R) long, pad after the first EOS
    response_mask: torch.Tensor  # (B, R) bool, True up to and including EOS
    has_eos: torch.Tensor  # (B,) bool
    logprobs: torch.Tensor  # (B, R) log pi_old(a_t | s_t) at temperature T
    ref_logprobs: torch.Tensor  # (B, R) log pi_ref(a_t | s_t) at temperature T
    values: torch.Tensor  # (B, R) V_old(s_t); zeros without a critic
    raw_scores: torch.Tensor  # (B,) RM score read at EOS (no RM among the sources: the reward)
    scores: torch.Tensor  # (B,) the reward: normalised (and combined) score after the EOS trick
    kl: torch.Tensor  # (B, R) per-token KL estimate
    non_score_rewards: torch.Tensor  # (B, R) -beta * KL
    advantages: torch.Tensor  # (B, R) from the algorithm (GAE, or one per response)
    returns: torch.Tensor  # (B, R) value targets: GAE advantages + values; zeros w/o critic
    # reward/* of a reward from several sources (rlhf_core/ppo/rewards.py); empty otherwise
    reward_metrics: dict[str, float] = field(default_factory=dict)


FORBIDDEN_LOGIT = -1e9  # finite, so entropy stays NaN-free (0 * log 0 -> 0)


def forbid_pad(logits: torch.Tensor, pad_id: int) -> torch.Tensor:
    """[..., V] -> the same tensor, PAD column set in place to FORBIDDEN_LOGIT: a sampled PAD
    would be masked as padding later and desynchronise old and new log-probs."""
    logits[..., pad_id] = FORBIDDEN_LOGIT
    return logits


def sampling_config(tokenizer, temperature: float, max_new_tokens: int,
                    static_cache: bool = False, model_generation=None) -> GenerationConfig:
    """Pure sampling at temperature T (top_k 0, top_p 1, PAD suppressed) up to the stop set;
    ``static_cache`` lets transformers compile the decode step."""
    extra = {"cache_implementation": "static"} if static_cache else {}
    return GenerationConfig(**extra,
        do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
        suppress_tokens=[tokenizer.pad_token_id],
        max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=stop_token_ids(tokenizer, model_generation), bos_token_id=None,
        return_dict_in_generate=True, output_logits=True,
    )


def _chunks(n: int, size: int | None) -> list[slice]:
    size = n if not size else size
    return [slice(start, min(start + size, n)) for start in range(0, n, size)]


def pad_to(t: torch.Tensor, length: int, value: float) -> torch.Tensor:
    """Right-pad dim 1 of [B, R, ...] to ``length``."""
    if t.shape[1] == length:
        return t
    shape = (t.shape[0], length - t.shape[1], *t.shape[2:])
    return torch.cat([t, t.new_full(shape, value)], dim=1)


@torch.inference_mode()
def generate(policy, prompt_ids: torch.Tensor, gen_config: GenerationConfig, pad_id: int,
             chunk: int | None = None):
    """Left-padded prompts [B, P] -> (responses [B, R], logits [B, R, V], PAD forbidden), by
    the lean sampling loop where the model fits it, else Hugging Face ``generate``; ``chunk``:
    prompts per call, grouped by length, each call trimmed to its longest."""
    if chunk and chunk < prompt_ids.shape[0]:
        lengths = (prompt_ids != pad_id).sum(1)
        order = torch.argsort(lengths, stable=True)
        parts = []
        for sl in _chunks(len(order), chunk):
            rows = order[sl]
            width = int(lengths[rows].max())
            parts.append(generate(policy, prompt_ids[rows, prompt_ids.shape[1] - width:],
                                  gen_config, pad_id))
        R = max(r.shape[1] for r, _ in parts)
        responses = torch.cat([pad_to(r, R, pad_id) for r, _ in parts])
        logits = torch.cat([pad_to(g, R, 0.0) for _, g in parts])
        inverse = torch.argsort(order)
        return responses[inverse], logits[inverse]
    if gen_config.cache_implementation is None and fits_lean_loop(policy):
        responses, logits = sample_responses(
            policy, prompt_ids, pad_id, gen_config.eos_token_id, gen_config.temperature,
            gen_config.max_new_tokens)
    else:
        out = policy.generate(input_ids=prompt_ids, attention_mask=prompt_ids != pad_id,
                              generation_config=gen_config)
        responses = out.sequences[:, prompt_ids.shape[1]:]  # (B, R)
        logits = torch.stack(out.logits, dim=1)  # (B, R, V), before temperature
    return responses, forbid_pad(logits, pad_id)


def batched(fn, query_responses: torch.Tensor, chunk: int | None) -> torch.Tensor:
    """fn over row chunks of [B, ...] concatenated (bounded memory for big batches)."""
    return torch.cat([fn(query_responses[sl]) for sl in _chunks(query_responses.shape[0], chunk)])


def response_logits(policy, query_responses: torch.Tensor, pad_id: int,
                    context_length: int) -> torch.Tensor:
    """Logits that predict each response token: [B, P+R] -> [B, R, V]. The last token is not
    fed (it predicts nothing used) and only the R predicting positions reach the LM head."""
    inputs = query_responses[:, :-1]  # (B, P+R-1)
    mask = inputs != pad_id
    length = query_responses.shape[1] - context_length
    out = policy(input_ids=inputs, attention_mask=mask,
                 position_ids=position_ids_from_mask(mask), logits_to_keep=length,
                 use_cache=False)
    return forbid_pad(out.logits, pad_id)  # (B, R, V): P-1+t predicts token t


def response_values(value_model: ScalarHeadModel, query_responses: torch.Tensor, pad_id: int,
                    context_length: int) -> torch.Tensor:
    """V(s_t) for each response step: [B, P+R] -> [B, R] (state = prompt + response[:t])."""
    inputs = query_responses[:, :-1]  # (B, P+R-1)
    values = value_model(inputs, inputs != pad_id)
    return values[:, context_length - 1:]


@torch.inference_mode()
def score_responses(reward_model: ScalarHeadModel, query_responses: torch.Tensor, pad_id: int,
                    context_length: int, response_mask: torch.Tensor) -> torch.Tensor:
    """RM score read at the last real response token (the EOS when present) -> [B]."""
    scores = reward_model(query_responses, query_responses != pad_id)  # (B, P+R)
    return gather_at(scores, context_length + last_token_index(response_mask))


def score_and_features(reward_model: ScalarHeadModel, query_responses: torch.Tensor,
                       pad_id: int, context_length: int,
                       response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`score_responses` and the hidden state read there [B, H] float32."""
    hidden = reward_model.hidden(query_responses, query_responses != pad_id)  # (B, P+R, H)
    index = context_length + last_token_index(response_mask)  # (B,)
    at = hidden[torch.arange(hidden.shape[0], device=hidden.device), index]  # (B, H)
    return gather_at(reward_model.scores(hidden), index), at.float()


@dataclass(frozen=True)
class RolloutSettings:
    temperature: float
    kl_estimator: str
    missing_eos_penalty: float | None
    divide_by_std: bool
    forward_batch_size: int | None = None  # rows per ref/value/reward forward
    generation_batch_size: int | None = None  # prompts per generate call, grouped by length
    recompute_logprobs: bool = False  # old log-probs from the update's forward, not generate


@torch.inference_mode()
def make_experience(
    models: PPOModels, prompt_ids: torch.Tensor, tokenizer, gen_config: GenerationConfig, *,
    kl_coef: float, norm_stats: dict[str, float], settings: RolloutSettings,
    algorithm: Algorithm, mix: RewardMix = RewardMix(), prompt_rows: list[int] | None = None,
    group: int = 1, iteration: int | None = None,
) -> Experience:
    """Generate for left-padded ``prompt_ids`` [B, P] and compute what the update needs;
    ``mix``: the reward's sources; ``group``: rows per prompt, dropped together when one is
    unscored."""
    policy, ref_policy, value_model, reward_model = models
    s = settings
    pad_id, eos_id = tokenizer.pad_token_id, gen_config.eos_token_id  # EOS: the stop set
    P = prompt_ids.shape[1]
    raw_responses, gen_logits = generate(policy, prompt_ids, gen_config, pad_id,
                                         s.generation_batch_size)
    responses, mask, has_eos = truncate_after_eos(raw_responses, eos_id, pad_id)
    query_responses = torch.cat([prompt_ids, responses], dim=1)  # (B, P+R)
    chunk = s.forward_batch_size

    def policy_logprobs(model):
        def fn(qr: torch.Tensor) -> torch.Tensor:
            logits = response_logits(model, qr, pad_id, P)
            return logprobs_from_logits(logits, qr[:, P:], s.temperature)
        return batched(fn, query_responses, chunk) * mask

    if s.recompute_logprobs:
        del gen_logits
        logprobs = policy_logprobs(policy)
    else:
        logprobs = logprobs_from_logits(gen_logits, responses, s.temperature) * mask
        del gen_logits
    ref_logprobs = policy_logprobs(ref_policy)
    if value_model is not None:
        values = batched(lambda qr: response_values(value_model, qr, pad_id, P),
                         query_responses, chunk) * mask
    else:  # a critic-free estimator
        values = torch.zeros_like(logprobs)
    if mix.model_name is not None:
        raw_scores = torch.cat([
            score_responses(reward_model, query_responses[sl], pad_id, P, mask[sl])
            for sl in _chunks(query_responses.shape[0], chunk)]).float()
    if mix.alone:
        scores = normalise_scores(raw_scores, norm_stats, s.divide_by_std)
        reward_metrics: dict[str, float] = {}
    else:
        raw, parts = {}, {}
        if mix.model_name is not None:
            raw[mix.model_name] = raw_scores
            parts[mix.model_name] = normalise_scores(raw_scores, norm_stats, s.divide_by_std)
        texts = decode_responses(tokenizer, responses, mask)
        rows = list(prompt_rows) if prompt_rows is not None else list(range(len(texts)))
        for scorer in mix.scorers:
            raw[scorer.name] = parts[scorer.name] = checked_scores(
                scorer.name, call_scorer(scorer, texts, rows, iteration), len(texts),
                iteration).to(query_responses.device)
        scores = combine(parts, mix.weights, mix.aggregation)
        keep = scored_rows(scores, group)
        reward_metrics = source_metrics(raw, parts, mix.aggregation, 1.0 - len(keep) / len(scores))
        if len(keep) == 0:
            raise ValueError(f"PPO iteration {iteration}: no reward source scored any of the "
                             f"{len(scores)} responses")
        if mix.model_name is None:
            raw_scores = scores
        if len(keep) < len(scores):  # a row no source scored takes no part in the update
            query_responses, responses, mask, has_eos, logprobs, ref_logprobs, values, \
                raw_scores, scores = (t[keep] for t in (
                    query_responses, responses, mask, has_eos, logprobs, ref_logprobs, values,
                    raw_scores, scores))
    if s.missing_eos_penalty is not None:
        scores = apply_eos_penalty(scores, has_eos, s.missing_eos_penalty)
    kl = kl_estimate(logprobs, ref_logprobs, s.kl_estimator) * mask
    shaped = algorithm.shape(scores, kl, values, mask, kl_coef)
    return Experience(
        query_responses=query_responses, context_length=P, responses=responses,
        response_mask=mask, has_eos=has_eos, logprobs=logprobs, ref_logprobs=ref_logprobs,
        values=values, raw_scores=raw_scores, scores=scores, kl=kl,
        non_score_rewards=shaped.non_score_rewards,
        advantages=shaped.advantages, returns=shaped.returns, reward_metrics=reward_metrics,
    )


def decode_responses(tokenizer, responses: torch.Tensor, mask: torch.Tensor) -> list[str]:
    """Each response's text, special tokens dropped."""
    return [tokenizer.decode(r[m], skip_special_tokens=True) for r, m in zip(responses, mask)]


def to_autograd_tensors(exp: Experience) -> Experience:
    """Clone inference-mode tensors (outside inference_mode) so autograd may save them."""
    fields = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in vars(exp).items()}
    return Experience(**fields)
