"""Mixed precision in the PPO update: the bf16 ratio is 1 on the first minibatch (on the CPU
and, where there is one, on CUDA, with either KV cache), fp16 steps scale the loss and keep
fp32 master weights (CUDA only)."""

import pytest
import torch

from rlhf_core.config import ModelConfig, OptimConfig, PPOConfig
from rlhf_core.models.data import encode
from rlhf_core.models.loader import LoadSpec, load_pretrained, load_tokenizer, ppo_models
from rlhf_core.ppo.trainer import PPOTrainer
from rlhf_core.train.train_step import TrainStep

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

PROMPTS = ["tell me about cats :", "hello :", "please tell me about the rain and sun :",
           "the dogs are nice :"]


def bf16_trainer(tiny_model_dir, tmp_path, device, **ppo):
    spec = LoadSpec.from_config(ModelConfig(precision="bf16", attn_implementation="sdpa"),
                                device)
    torch.manual_seed(0)
    load_pretrained(tiny_model_dir, LoadSpec(), "new_head").save(tmp_path / "rm")
    models = ppo_models(tiny_model_dir, tiny_model_dir, tmp_path / "rm", tmp_path / "rm", spec)
    tok = load_tokenizer(tiny_model_dir, spec)
    cfg = PPOConfig(iterations=3, rollout_batch_size=4, num_minibatches=2, ppo_epochs=1,
                    max_new_tokens=12, optim=OptimConfig(lr=1e-3), **ppo)
    return PPOTrainer(models, tokenizer=tok, prompt_ids=[encode(tok, p) for p in PROMPTS],
                      cfg=cfg, norm_stats={"mean": 0.0, "std": 1.0, "n": 1},
                      device=torch.device(device), generator=torch.Generator().manual_seed(0),
                      precision=spec.precision)


def first_minibatch_stats(trainer) -> list[dict[str, float]]:
    """Runs ``trainer.step()`` twice and returns, per iteration, the stats of the update's
    first minibatch: its loss runs before any optimizer step of that iteration, on the
    policy that made the rollout, so its ratio must be 1 up to the rounding of the compute
    precision (the iteration's ``val/ratio`` averages over later minibatches too, whose
    policy has legitimately moved)."""
    firsts: list[dict[str, float]] = []
    seen = {"calls": 0}
    loss_fn = trainer.minibatch_loss

    def spy(exp, rows, R):
        loss, values = loss_fn(exp, rows, R)
        if seen["calls"] == 0:
            firsts.append({k: float(v) for k, v in values.items()})
        seen["calls"] += 1
        return loss, values

    trainer.minibatch_loss = spy
    for _ in range(2):
        seen["calls"] = 0
        trainer.step()
    return firsts


@pytest.mark.parametrize("device,static_cache", [
    ("cpu", False),
    pytest.param("cuda", False, marks=CUDA),
    pytest.param("cuda", True, marks=CUDA),
])
def test_bf16_ratio_is_one_on_the_first_minibatch(tiny_model_dir, tmp_path, device,
                                                   static_cache):
    tr = bf16_trainer(tiny_model_dir, tmp_path, device, static_cache=static_cache)
    assert tr.train_step.precision == "bf16" and tr.settings.recompute_logprobs
    for stats in first_minibatch_stats(tr):
        print("first minibatch", device, "static cache" if static_cache else "dynamic cache",
              {k: round(v, 6) for k, v in stats.items()})
        # bf16 keeps 8 bits of mantissa: the same forward on other shapes rounds differently
        assert abs(stats["val/ratio"] - 1) < 2e-3, stats
        assert stats["policy/approxkl_avg"] < 1e-5, stats
        assert stats["policy/clipfrac_avg"] == 0.0, stats
    assert all(p.dtype == torch.float32 for p in tr.policy.parameters())
    assert next(tr.ref_policy.parameters()).dtype == torch.bfloat16


@CUDA
def test_cuda_fp16_step_scales_and_keeps_fp32_masters():
    model = torch.nn.Linear(8, 1).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    step = TrainStep(model.parameters(), opt, sched, 1.0, "fp16", "cuda", name="t")
    before = model.weight.detach().clone()
    x = torch.randn(16, 8, device="cuda")
    step.run([lambda: (model(x).pow(2).mean(), 1.0)], 1)
    assert step.scaler is not None and model.weight.dtype == torch.float32
    assert not torch.equal(model.weight, before)


@CUDA
def test_cuda_compiled_update_matches_the_eager_one(tiny_model_dir, tmp_path):
    """ppo.compile: the blocks' compiled twins run only inside the update and compute what
    the eager blocks compute on the same padded minibatch (up to bf16 rounding)."""
    from torch._dynamo.utils import counters

    tr = bf16_trainer(tiny_model_dir, tmp_path, "cuda", compile=True)
    captured = counters["stats"]["calls_captured"]
    _, exp = tr.step()  # compiles inside the update; the rollout stays eager
    assert counters["stats"]["calls_captured"] > captured
    assert all(block._compiled_call_impl is None for block in tr.compiled.blocks)
    rows, R = torch.arange(2), int(exp.response_mask[:2].sum(1).max())
    with tr.train_step.autocast():
        eager_loss, eager = tr.minibatch_loss(exp, rows, R)
        with tr.compiled.active():
            compiled_loss, compiled = tr.minibatch_loss(exp, rows, R)
    assert torch.allclose(compiled_loss.float(), eager_loss.float(), rtol=2e-2, atol=1e-3)
    for key in ("val/ratio", "policy/entropy_avg", "loss/value_avg"):
        got, want = float(compiled[key].detach()), float(eager[key].detach())
        assert abs(got - want) < 2e-2 * max(
            1.0, abs(want)), key
