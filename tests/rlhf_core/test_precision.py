"""Mixed precision and the shared training step: bf16 autocast over fp32 master weights gives
a policy ratio of 1 before any update (old and new log-probs from one numeric path), and
micro-batch gradient accumulation equals the whole minibatch."""

import copy

import pytest
import torch

from rlhf_core.config import OptimConfig, PPOConfig
from rlhf_core.models.data import encode
from rlhf_core.models.loader import LoadSpec, load_pretrained, load_tokenizer
from rlhf_core.models.models import PPOModels
from rlhf_core.ppo.ppo_math import logprobs_from_logits
from rlhf_core.ppo.rollout import response_logits, to_autograd_tensors
from rlhf_core.ppo.trainer import PPOTrainer
from rlhf_core.train.train_step import TrainStep

PROMPTS = ["tell me about cats :", "hello :", "please tell me about the rain and sun :",
           "the dogs are nice :", "tell me about the sun :", "hello world :"]
RATIO_TOL = 1e-3  # |ratio - 1| per token before any update, bf16 autocast (0.0 seen on CPU)


def trainer(tiny_model_dir, precision="fp32", **ppo):
    torch.manual_seed(0)
    tok = load_tokenizer(str(tiny_model_dir))
    policy = load_pretrained(tiny_model_dir, LoadSpec())
    ref = load_pretrained(tiny_model_dir, LoadSpec())
    value = load_pretrained(tiny_model_dir, LoadSpec(), "new_head")
    reward = load_pretrained(tiny_model_dir, LoadSpec(), "new_head")
    cfg = PPOConfig(iterations=2, rollout_batch_size=6, num_minibatches=1, ppo_epochs=1,
                    max_new_tokens=10, optim=OptimConfig(lr=1e-3), **ppo)
    return PPOTrainer(PPOModels(policy, ref, value, reward), tokenizer=tok,
                      prompt_ids=[encode(tok, p) for p in PROMPTS], cfg=cfg,
                      norm_stats={"mean": 0.0, "std": 1.0, "n": 1}, device=torch.device("cpu"),
                      generator=torch.Generator().manual_seed(0), precision=precision)


def rollout(tr):
    with tr.train_step.autocast():
        from rlhf_core.ppo.rollout import make_experience

        exp = make_experience(tr.models, tr.next_prompts(), tr.tokenizer, tr.gen_config,
                              kl_coef=tr.kl_ctl.value, norm_stats=tr.norm_stats,
                              settings=tr.settings, algorithm=tr.algorithm)
    return to_autograd_tensors(exp)


def test_bf16_old_and_new_logprobs_agree_before_any_update(tiny_model_dir):
    tr = trainer(tiny_model_dir, precision="bf16")
    assert tr.settings.recompute_logprobs
    exp = rollout(tr)
    idx = torch.tensor([4, 1, 3])  # a minibatch as the update forms it: subset, trimmed
    R = int(exp.response_mask[idx].sum(1).max())
    with tr.train_step.autocast(), torch.no_grad():
        logits = response_logits(tr.policy, exp.query_responses[idx, : exp.context_length + R],
                                 tr.tokenizer.pad_token_id, exp.context_length)
        new = logprobs_from_logits(logits, exp.responses[idx, :R], 0.7)
    mask = exp.response_mask[idx, :R]
    ratio = torch.exp(new - exp.logprobs[idx, :R])[mask]
    assert (ratio - 1).abs().max() < RATIO_TOL
    # and bf16 is really in use: the fp32 forward differs by more than rounding of fp32
    with torch.no_grad():
        fp32 = logprobs_from_logits(response_logits(
            tr.policy, exp.query_responses[idx, : exp.context_length + R],
            tr.tokenizer.pad_token_id, exp.context_length), exp.responses[idx, :R], 0.7)
    assert (fp32 - new)[mask].abs().max() > 1e-5
    # master weights and optimizer state stay float32 after a bf16 update
    tr.update(exp)
    assert all(p.dtype == torch.float32 for p in tr.policy.parameters())
    state = next(iter(tr.optimizer.state.values()))
    assert state["exp_avg"].dtype == torch.float32


def test_micro_batches_accumulate_to_the_whole_minibatch(tiny_model_dir):
    whole = trainer(tiny_model_dir)
    micro = trainer(tiny_model_dir, micro_batch_size=2)
    exp = rollout(whole)
    micro.policy.load_state_dict(whole.policy.state_dict())
    stats_whole = whole.update(copy.deepcopy(exp))
    stats_micro = micro.update(copy.deepcopy(exp))
    for a, b in zip(whole.policy.parameters(), micro.policy.parameters()):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-5)
    for a, b in zip(whole.value_model.parameters(), micro.value_model.parameters()):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-5)
    for key in ("loss/policy_avg", "loss/value_avg", "val/ratio"):
        assert stats_whole[key] == pytest.approx(stats_micro[key], rel=1e-5, abs=1e-7)


def test_train_step_names_the_step_of_a_non_finite_loss():
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    step = TrainStep(model.parameters(), opt, sched, 1.0, name="sft")
    before = model.weight.detach().clone()
    with pytest.raises(FloatingPointError, match="non-finite sft loss at step 7"):
        step.run([lambda: (model(torch.ones(1, 2)).sum() * float("nan"), 1.0)], 7)
    assert torch.equal(model.weight, before)


@pytest.mark.parametrize("units,pretrained,device,expected", [
    ("amx", True, "cpu", "bf16"), ("avx512_bf16", True, "cpu", "bf16"),
    ("none", True, "cpu", "fp32"),      # emulated bf16 is slower than float32
    ("amx", False, "cpu", "fp32"),      # the demo's tiny model: its fp32 figures kept
    ("none", False, "cuda", "bf16")])
def test_auto_picks_bf16_only_where_the_hardware_has_it_and_the_model_is_pretrained(
        monkeypatch, units, pretrained, device, expected):
    import rlhf_core.models.precision as precision

    monkeypatch.setattr(precision, "cpu_bf16_units", lambda: units)
    chosen, why = precision.choose_precision("auto", device, pretrained)
    assert chosen == expected and why.startswith("auto")
    assert precision.choose_precision("auto", device, pretrained)[0] == expected
    # an explicit setting is kept on any CPU
    assert precision.choose_precision("fp32", "cpu", pretrained) == ("fp32", "model.precision")
    assert precision.choose_precision("bf16", "cpu", pretrained)[0] == "bf16"


def test_the_load_spec_resolves_auto_from_the_model_section(monkeypatch):
    import rlhf_core.models.precision as precision
    from rlhf_core.config import ModelConfig
    from rlhf_core.models.loader import LoadSpec

    monkeypatch.setattr(precision, "cpu_bf16_units", lambda: "amx")
    assert LoadSpec.from_config(ModelConfig(base_model="some/model"), "cpu").precision == "bf16"
    assert LoadSpec.from_config(ModelConfig(), "cpu").precision == "fp32"
    assert LoadSpec.from_config(ModelConfig(base_model="some/model", precision="fp32"),
                                "cpu").precision == "fp32"
