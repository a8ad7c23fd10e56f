"""The rollout's lean sampling loop (rlhf_core/models/sampling.py): with generate's sampler it is
Hugging Face ``generate``, token for token and logit for logit (left-padded prompts; rows that
end at different steps; every row ending at its first token; no row ending); its own sampler
draws the categorical distribution and never a zero-probability token."""

import pytest
import torch

from rlhf_core.models.data import encode, left_pad
from rlhf_core.models.loader import LoadSpec, load_pretrained, load_tokenizer
from rlhf_core.models.sampling import (
    ReservedLayer,
    fits_lean_loop,
    inverse_cdf,
    multinomial,
    sample_responses,
)
from rlhf_core.ppo.ppo_math import logprobs_from_logits, truncate_after_eos
from rlhf_core.ppo.rollout import forbid_pad, response_logits, sampling_config

PROMPTS = ["tell me about cats :", "hello :", "please tell me about the rain and sun :",
           "sure", "the dogs are nice and the cats are good :", "thanks !"]


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    policy = load_pretrained(tiny_model_dir, LoadSpec()).eval()
    prompts = left_pad([encode(tok, p) for p in PROMPTS], tok.pad_token_id)
    return tok, policy, prompts


def _eos_bias(policy, eos_id: int, bias: float):
    """Add ``bias`` to the EOS logit (a hook on the LM head, seen by both samplers)."""
    def hook(_module, _inputs, out):
        out = out.clone()
        out[..., eos_id] += bias
        return out
    return policy.lm_head.register_forward_hook(hook)


@pytest.mark.parametrize("eos_bias,temperature", [(2.5, 0.7), (40.0, 1.0), (-1e4, 0.7)])
def test_the_lean_loop_with_generates_sampler_is_generate(setup, eos_bias, temperature):
    tok, policy, prompts = setup
    pad, eos, n_new = tok.pad_token_id, tok.eos_token_id, 10
    handle = _eos_bias(policy, eos, eos_bias)
    try:
        torch.manual_seed(3)
        out = policy.generate(input_ids=prompts, attention_mask=prompts != pad,
                              generation_config=sampling_config(tok, temperature, n_new))
        torch.manual_seed(3)
        responses, logits = sample_responses(policy, prompts, pad, eos, temperature, n_new,
                                             sampler=multinomial)
    finally:
        handle.remove()
    torch.testing.assert_close(responses, out.sequences[:, prompts.shape[1]:], rtol=0, atol=0)
    torch.testing.assert_close(logits, torch.stack(out.logits, 1), rtol=0, atol=0)
    _, mask, has_eos = truncate_after_eos(responses, eos, pad)
    lengths = mask.sum(1)
    assert not (responses == pad).logical_and(mask).any()  # PAD only after the EOS
    if eos_bias > 10:  # every row ends at its first token: one step, no more
        assert responses.shape[1] == 1 and has_eos.all()
    elif eos_bias < 0:  # no row ends: the whole budget
        assert responses.shape[1] == n_new and not has_eos.any()
    else:  # rows end at different steps, and the loop stops when the last one has
        assert has_eos.all() and len(set(lengths.tolist())) > 2
        assert responses.shape[1] == int(lengths.max()) < n_new


def test_lean_logits_give_the_log_probs_of_a_full_forward(setup):
    tok, policy, prompts = setup
    pad, P = tok.pad_token_id, prompts.shape[1]
    torch.manual_seed(0)
    raw, logits = sample_responses(policy, prompts, pad, tok.eos_token_id, 0.7, 8)
    responses, mask, _ = truncate_after_eos(raw, tok.eos_token_id, pad)
    with torch.no_grad():
        full = response_logits(policy, torch.cat([prompts, responses], 1), pad, P)
    old = logprobs_from_logits(forbid_pad(logits.clone(), pad), responses, 0.7) * mask
    new = logprobs_from_logits(full, responses, 0.7) * mask
    torch.testing.assert_close(old, new, atol=1e-5, rtol=1e-5)


def test_inverse_cdf_draws_the_categorical_distribution():
    probs = torch.tensor([0.0, 0.5, 0.0, 0.2, 0.25, 0.05, 0.0])  # zeros first, inside, last
    n = 40_000
    torch.manual_seed(0)
    draws = inverse_cdf(probs.expand(n, -1))
    freq = torch.bincount(draws, minlength=len(probs)).double() / n
    assert freq[probs == 0].sum() == 0  # a zero-probability token is never drawn
    # 4.5 standard errors of a binomial frequency at p = 0.5
    torch.testing.assert_close(freq, probs.double(), atol=4.5 * (0.25 / n) ** 0.5, rtol=0)


def test_inverse_cdf_at_the_top_of_the_unit_interval_draws_the_last_possible_token(
        monkeypatch):
    probs = torch.tensor([[0.3, 0.7, 0.0, 0.0], [0.1, 0.2, 0.3, 0.4]])  # PAD last, at 0
    monkeypatch.setattr(torch, "rand", lambda shape, **kw: torch.ones(shape, **kw))
    assert inverse_cdf(probs).tolist() == [1, 3]


def test_models_that_do_not_fit_the_loop_keep_generate(setup):
    _, policy, _ = setup
    assert fits_lean_loop(policy)

    class NoCache(torch.nn.Module):
        config = policy.config

        def forward(self, input_ids, attention_mask=None):
            return input_ids

    assert not fits_lean_loop(NoCache())


def test_a_reserved_layer_holds_what_a_dynamic_layer_holds_and_refuses_to_overflow():
    from transformers.cache_utils import DynamicLayer

    torch.manual_seed(0)
    reserved, dynamic = ReservedLayer(capacity=7), DynamicLayer()
    for length in (5, 1, 1):  # a prefill, then one token a step, up to the capacity
        k, v = torch.randn(3, 2, length, 4), torch.randn(3, 2, length, 4)
        got, want = reserved.update(k, v), dynamic.update(k, v)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert reserved.get_seq_length() == dynamic.get_seq_length()
    with pytest.raises(ValueError, match="reserved for 7 positions, asked for 8"):
        reserved.update(torch.randn(3, 2, 1, 4), torch.randn(3, 2, 1, 4))
