"""GPU-only checks (skipped without CUDA): bf16 and fp16 training steps keep fp32 master
weights, the bf16 ratio is 1 before an update, and the static-cache compiled decode runs."""

import pytest
import torch

from rlhf_core.config import ModelConfig, OptimConfig, PPOConfig
from rlhf_core.models.data import encode
from rlhf_core.models.loader import LoadSpec, load_tokenizer, new_scalar_model
from rlhf_core.models.lora import ppo_models
from rlhf_core.ppo.trainer import PPOTrainer
from rlhf_core.train.train_step import TrainStep

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

PROMPTS = ["tell me about cats :", "hello :", "please tell me about the rain and sun :",
           "the dogs are nice :"]


def cuda_trainer(tiny_model_dir, tmp_path, precision, **ppo):
    spec = LoadSpec.from_config(ModelConfig(precision=precision, attn_implementation="sdpa"),
                                "cuda")
    torch.manual_seed(0)
    new_scalar_model(tiny_model_dir, LoadSpec()).save(tmp_path / "rm")
    models = ppo_models(tiny_model_dir, tiny_model_dir, tmp_path / "rm", tmp_path / "rm", spec)
    tok = load_tokenizer(tiny_model_dir, spec)
    cfg = PPOConfig(iterations=3, rollout_batch_size=4, num_minibatches=2, ppo_epochs=1,
                    max_new_tokens=12, optim=OptimConfig(lr=1e-3), **ppo)
    return PPOTrainer(models, tokenizer=tok, prompt_ids=[encode(tok, p) for p in PROMPTS],
                      cfg=cfg, norm_stats={"mean": 0.0, "std": 1.0, "n": 1},
                      device=torch.device("cuda"), generator=torch.Generator().manual_seed(0),
                      precision=spec.precision)


@pytest.mark.parametrize("static_cache", [False, True])
def test_cuda_bf16_ratio_is_one_before_the_first_update(tiny_model_dir, tmp_path, static_cache):
    tr = cuda_trainer(tiny_model_dir, tmp_path, "auto", static_cache=static_cache)
    assert tr.train_step.precision == "bf16"
    for _ in range(2):
        metrics, _ = tr.step()
        # first epoch, first minibatch sees ratio 1; averaged over the update it stays near 1
        assert abs(metrics["val/ratio"] - 1) < 1e-2
    assert all(p.dtype == torch.float32 for p in tr.policy.parameters())
    assert next(tr.ref_policy.parameters()).dtype == torch.bfloat16


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
