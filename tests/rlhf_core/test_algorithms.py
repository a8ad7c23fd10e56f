"""The RL loop with each algorithm: critic-free estimators on a tiny GPT-2, config checks."""

import pytest
import torch
from pydantic import ValidationError

from rlhf_core.config import OptimConfig, PPOConfig
from rlhf_core.models.data import encode
from rlhf_core.models.loader import LoadSpec, load_pretrained, load_tokenizer
from rlhf_core.models.models import PPOModels
from rlhf_core.ppo.algorithms import GAE, RLOO, make_algorithm
from rlhf_core.ppo.trainer import PPOTrainer

PROMPTS = ["tell me about cats :", "hello :", "please tell me about the rain and sun :"]
NORM = {"mean": 0.0, "std": 1.0, "n": 1}
VALUE_KEYS = ("loss/value_avg", "val/clipfrac_avg", "val/explained_variance",
              "val/grad_norm_avg")
DIAGNOSTICS = ("objective/advantage_abs_mean", "policy/grad_norm_avg", "response/length_max",
               "response/truncated_rate")


def trainer_for(tiny_model_dir, with_critic: bool, **kw):
    torch.manual_seed(0)
    tok = load_tokenizer(str(tiny_model_dir))
    policy = load_pretrained(tiny_model_dir, LoadSpec())
    ref = load_pretrained(tiny_model_dir, LoadSpec())
    value = load_pretrained(tiny_model_dir, LoadSpec(), "new_head") if with_critic else None
    reward = load_pretrained(tiny_model_dir, LoadSpec(), "new_head")
    cfg = PPOConfig(**{"iterations": 2, "rollout_batch_size": 4, "num_minibatches": 2,
                       "ppo_epochs": 1, "max_new_tokens": 6, "optim": OptimConfig(lr=1e-3),
                       **kw})
    return PPOTrainer(PPOModels(policy, ref, value, reward), tokenizer=tok,
                      prompt_ids=[encode(tok, p) for p in PROMPTS], cfg=cfg, norm_stats=NORM,
                      device=torch.device("cpu"), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("estimator,extra", [
    ("rloo", {"samples_per_prompt": 2}),
    ("grpo", {"samples_per_prompt": 2, "kl_in_loss": True}),
    ("reinforce_baseline", {}),
])
def test_critic_free_step_moves_policy_without_value_metrics(tiny_model_dir, estimator, extra):
    trainer = trainer_for(tiny_model_dir, False, advantage_estimator=estimator, **extra)
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    seen = []
    trainer.train(lambda i, m, s: seen.append(m), progress=False)
    metrics = seen[-1]
    assert not any(k in metrics for k in VALUE_KEYS)
    assert metrics["loss/policy_avg"] == metrics["loss/policy_avg"]
    assert ("loss/kl_loss_avg" in metrics) == bool(extra.get("kl_in_loss"))
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.policy.parameters()))
    assert trainer.value_model is None
    assert "value" not in trainer.checkpointer("unused").models
    # the guides' diagnostics, for every algorithm (a critic's gradient norm with a critic)
    assert all(metrics[k] >= 0 for k in DIAGNOSTICS) and "val/grad_norm_avg" not in metrics


def test_groups_of_k_share_a_prompt_and_advantages_sum_to_zero(tiny_model_dir):
    trainer = trainer_for(tiny_model_dir, False, advantage_estimator="rloo",
                          samples_per_prompt=2, whiten_advantages=False, rollout_batch_size=6)
    prompts = trainer.next_prompts()
    assert prompts.shape[0] == 6
    assert torch.equal(prompts[0::2], prompts[1::2])  # rows 2g and 2g+1 answer prompt g
    _, exp = trainer.step()
    first = exp.advantages[:, 0]  # one advantage per response, on every real token
    assert float(first.view(3, 2).sum(1).abs().max()) < 1e-5
    assert torch.all(exp.returns == 0) and torch.all(exp.values == 0)


def test_gae_is_the_default_and_keeps_its_critic(tiny_model_dir):
    assert isinstance(make_algorithm(PPOConfig()), GAE)
    trainer = trainer_for(tiny_model_dir, True)
    seen = []
    trainer.train(lambda i, m, s: seen.append(m), progress=False)
    assert all(k in seen[-1] for k in VALUE_KEYS + DIAGNOSTICS)


def test_the_diagnostics_against_naive_references(tiny_model_dir):
    """Each model's gradient norm before the clip, mean |advantage| over the response
    tokens, the longest response and the share cut at the budget, recomputed by hand."""
    trainer = trainer_for(tiny_model_dir, True, max_new_tokens=3, ppo_epochs=1,
                          num_minibatches=1)
    norms: dict[str, list[float]] = {"policy": [], "value": []}
    run = trainer.train_step.run

    def spy(micro_batches, step):
        out = run(micro_batches, step)  # the norms as the step saw them, before the clip
        for name, model in (("policy", trainer.policy), ("value", trainer.value_model)):
            grads = [p.grad.double().pow(2).sum() for p in model.parameters()
                     if p.grad is not None]
            norms[name].append(float(sum(grads)) ** 0.5)
        return out

    # the clip (max_grad_norm 1) scales the gradients in place: undo it to read the pre-clip
    trainer.train_step.max_grad_norm = 1e9
    trainer.train_step.run = spy
    metrics, exp = trainer.step()
    assert metrics["policy/grad_norm_avg"] == pytest.approx(norms["policy"][0], rel=1e-5)
    assert metrics["val/grad_norm_avg"] == pytest.approx(norms["value"][0], rel=1e-5)
    mask = exp.response_mask
    tokens = [abs(float(a)) for a, m in zip(exp.advantages.flatten(), mask.flatten()) if m]
    assert metrics["objective/advantage_abs_mean"] == pytest.approx(sum(tokens) / len(tokens))
    lengths = [int(row.sum()) for row in mask]
    assert metrics["response/length_max"] == max(lengths)
    cut = [n == 3 and not bool(e) for n, e in zip(lengths, exp.has_eos)]
    assert metrics["response/truncated_rate"] == pytest.approx(sum(cut) / len(cut))


def test_value_model_must_match_the_estimator(tiny_model_dir):
    with pytest.raises(ValueError, match="has no critic"):
        trainer_for(tiny_model_dir, True, advantage_estimator="reinforce_baseline")
    with pytest.raises(ValueError, match="needs a value model"):
        trainer_for(tiny_model_dir, False)


@pytest.mark.parametrize("estimator", ["rloo", "grpo"])
def test_config_refuses_k1_for_group_estimators(estimator):
    with pytest.raises(ValidationError, match="samples_per_prompt >= 2"):
        PPOConfig(advantage_estimator=estimator)
    with pytest.raises(ValidationError, match="divisible by ppo.samples_per_prompt"):
        PPOConfig(advantage_estimator=estimator, samples_per_prompt=3, rollout_batch_size=64)
    assert not PPOConfig(advantage_estimator=estimator, samples_per_prompt=4).uses_critic


def test_reward_penalty_moves_to_the_loss_with_kl_in_loss():
    scores = torch.tensor([1.0, 0.0, 2.0, 1.0])
    kl = torch.full((4, 3), 0.5)
    mask = torch.ones(4, 3, dtype=torch.bool)
    zeros = torch.zeros(4, 3)
    in_reward = RLOO(PPOConfig(advantage_estimator="rloo", samples_per_prompt=2,
                               whiten_advantages=False)).shape(scores, kl, zeros, mask, 0.1)
    in_loss = RLOO(PPOConfig(advantage_estimator="rloo", samples_per_prompt=2,
                             whiten_advantages=False, kl_in_loss=True)
                   ).shape(scores, kl, zeros, mask, 0.1)
    assert torch.allclose(in_reward.non_score_rewards, torch.full((4, 3), -0.05))
    assert torch.all(in_loss.non_score_rewards == 0)
    # equal KL in every row: the leave-one-out baseline removes it either way
    assert torch.allclose(in_reward.advantages, in_loss.advantages)
    assert in_reward.advantages[:, 0].tolist() == pytest.approx([1.0, -1.0, 1.0, -1.0])
