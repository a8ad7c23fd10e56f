"""Rollout and PPO update on a tiny GPT-2: padding, old log-probs, trimming, one step."""

import dataclasses
import re
from pathlib import Path

import pytest
import torch

from rlhf_core.config import OptimConfig, PPOConfig
from rlhf_core.models.data import encode, left_pad
from rlhf_core.models.models import PPOModels
from rlhf_core.ppo.algorithms import GAE
from rlhf_core.ppo.ppo_math import logprobs_from_logits
from rlhf_core.ppo.rollout import (
    Experience,
    RolloutSettings,
    make_experience,
    response_logits,
    sampling_config,
)
from rlhf_core.ppo.trainer import PPOTrainer

PROMPTS = ["tell me about cats :", "hello :", "please tell me about the rain and sun :"]


def settings(**kw):
    base = dict(temperature=0.7, kl_estimator="k1", missing_eos_penalty=-1.0,
                divide_by_std=False)
    return RolloutSettings(**{**base, **kw})


def experience(models, max_new_tokens=8):
    tok, policy, ref, value, reward = models
    prompt_ids = left_pad([encode(tok, p) for p in PROMPTS], tok.pad_token_id)
    return make_experience(PPOModels(policy, ref, value, reward), prompt_ids, tok,
                           sampling_config(tok, 0.7, max_new_tokens), kl_coef=0.05,
                           norm_stats={"mean": 0.0, "std": 1.0, "n": 1}, settings=settings(),
                           algorithm=GAE(PPOConfig()))


def test_old_logprobs_from_generation_match_a_forward_pass(models):
    tok, policy, *_ = models
    exp = experience(models)
    with torch.no_grad():
        logits = response_logits(policy, exp.query_responses, tok.pad_token_id,
                                 exp.context_length)
        recomputed = logprobs_from_logits(logits, exp.responses, 0.7) * exp.response_mask
    torch.testing.assert_close(exp.logprobs, recomputed, atol=1e-4, rtol=1e-4)
    # the policy equals the reference here, so the KL is ~0 at every token
    assert exp.kl.abs().max() < 1e-4


def test_experience_is_masked_and_eos_trick_applied(models):
    exp = experience(models, max_new_tokens=3)
    outside = ~exp.response_mask
    for t in (exp.logprobs, exp.values, exp.advantages, exp.returns,
              exp.non_score_rewards, exp.kl):
        assert torch.all(t[outside] == 0)
    no_eos = ~exp.has_eos
    assert torch.all(exp.scores[no_eos] == -1.0)
    assert torch.all(exp.responses[outside] == models[0].pad_token_id)


def test_left_padding_does_not_change_response_logits(models):
    tok, policy, *_ = models
    exp = experience(models)
    P = exp.context_length
    with torch.no_grad():
        batch = response_logits(policy, exp.query_responses, tok.pad_token_id, P)
        for i in range(len(PROMPTS)):
            row = exp.query_responses[i]
            n_pad = int((row[:P] == tok.pad_token_id).sum())
            alone = response_logits(policy, row[n_pad:].unsqueeze(0), tok.pad_token_id, P - n_pad)
            m = exp.response_mask[i]
            torch.testing.assert_close(batch[i][m], alone[0][m], atol=1e-4, rtol=1e-4)


def test_ppo_step_moves_policy_and_logs_trl_metrics(models):
    tok, policy, ref, value, reward = models
    before = [p.detach().clone() for p in policy.parameters()]
    cfg = PPOConfig(iterations=2, rollout_batch_size=4, num_minibatches=2, ppo_epochs=2,
                    max_new_tokens=6, optim=OptimConfig(lr=1e-3))
    trainer = PPOTrainer(PPOModels(policy, ref, value, reward), tokenizer=tok,
                         prompt_ids=[encode(tok, p) for p in PROMPTS], cfg=cfg,
                         norm_stats={"mean": 0.0, "std": 1.0, "n": 1},
                         device=torch.device("cpu"), generator=torch.Generator().manual_seed(0))
    seen = []
    trainer.train(lambda i, m, s: seen.append((i, m)), progress=False)
    assert [i for i, _ in seen] == [1, 2]
    metrics = seen[-1][1]
    for key in ("objective/kl", "policy/approxkl_avg", "loss/value_avg", "val/ratio",
                "episode", "response/eos_rate"):
        assert key in metrics and metrics[key] == metrics[key], key
    assert metrics["episode"] == 8
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters()))
    assert all(not p.requires_grad for p in reward.parameters())


def test_ppo_entropy_metric_is_the_entropy_of_the_sampled_distribution(models):
    """policy/entropy_avg (and the entropy bonus) use logits / T, like sampling and log-probs;
    one epoch of one minibatch measures it before the update moves the policy."""
    import copy

    from rlhf_core.masked import masked_mean
    from rlhf_core.ppo.ppo_math import entropy_from_log_softmax, log_softmax_at

    tok, policy, ref, value, reward = models
    before = copy.deepcopy(policy)
    cfg = PPOConfig(iterations=1, rollout_batch_size=3, num_minibatches=1, ppo_epochs=1,
                    max_new_tokens=6, temperature=0.5, optim=OptimConfig(lr=1e-3))
    trainer = PPOTrainer(PPOModels(policy, ref, value, reward), tokenizer=tok,
                         prompt_ids=[encode(tok, p) for p in PROMPTS], cfg=cfg,
                         norm_stats={"mean": 0.0, "std": 1.0, "n": 1},
                         device=torch.device("cpu"), generator=torch.Generator().manual_seed(0))
    metrics, exp = trainer.step()
    R = int(exp.response_mask.sum(1).max())
    P = exp.context_length
    with torch.no_grad():
        logits = response_logits(before, exp.query_responses[:, : P + R], tok.pad_token_id, P)
    mask = exp.response_mask[:, :R]
    sampled = float(masked_mean(entropy_from_log_softmax(log_softmax_at(logits, 0.5)), mask))
    untempered = float(masked_mean(entropy_from_log_softmax(log_softmax_at(logits)), mask))
    assert metrics["policy/entropy_avg"] == pytest.approx(sampled, rel=1e-4)
    assert abs(sampled - untempered) > 1e-2


def test_every_experience_field_is_read_somewhere():
    """A rollout field nothing reads (``exp.<field>`` in rlhf_core/ or tasks/) is dead weight
    carried through every minibatch: remove it."""
    root = Path(__file__).resolve().parents[2]
    source = "".join(p.read_text() for d in ("rlhf_core", "tasks")
                     for p in (root / d).rglob("*.py"))
    unread = [f.name for f in dataclasses.fields(Experience)
              if not re.search(rf"\bexp\.{f.name}\b", source)]
    assert not unread, unread
