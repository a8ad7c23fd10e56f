import pytest
from pydantic import ValidationError

from rlhf_core.config import OptimConfig, PPOConfig
from rlhf_core.train.optim import build_optimizer


def test_ppo_config_defaults_follow_the_recipe():
    cfg = PPOConfig()
    assert (cfg.gamma, cfg.lam, cfg.clip_eps, cfg.vf_coef) == (1.0, 0.95, 0.2, 0.1)
    assert cfg.ppo_epochs == 4 and cfg.missing_eos_penalty == -1.0
    assert cfg.optim.adam_eps == 1e-5
    assert cfg.minibatch_size == cfg.rollout_batch_size // cfg.num_minibatches


def test_config_is_frozen_and_strict():
    cfg = PPOConfig()
    with pytest.raises(ValidationError):
        cfg.kl_coef = 1.0
    with pytest.raises(ValidationError, match="kl_coeff"):
        PPOConfig(kl_coeff=0.1)
    with pytest.raises(ValidationError, match="divisible"):
        PPOConfig(rollout_batch_size=10, num_minibatches=3)


@pytest.mark.parametrize("schedule", ["linear", "cosine", "constant"])
def test_schedule_warms_up_then_decays(schedule):
    import torch

    p = torch.nn.Parameter(torch.zeros(1))
    opt, sched = build_optimizer([p], OptimConfig(lr=1.0, warmup_ratio=0.2,
                                                  schedule=schedule), 10)
    lrs = []
    for _ in range(10):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert lrs[0] < lrs[2] <= 1.0  # warm-up
    if schedule == "constant":
        assert lrs[-1] == 1.0
    else:
        assert lrs[-1] < lrs[3]
