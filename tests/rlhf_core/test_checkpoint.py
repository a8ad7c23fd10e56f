"""Checkpoints: atomic saves, keep-last-N, RNG round trips, and resume == uninterrupted run
(bit for bit) for SFT, the reward model and PPO; non-finite values stop at a named step."""

import random

import numpy as np
import pytest
import torch

from rlhf_core.config import OptimConfig, PPOConfig, RewardConfig, SFTConfig
from rlhf_core.models.checkpoint import Checkpointer, atomic_dir, capture_rng, restore_rng
from rlhf_core.models.data import encode
from rlhf_core.models.loader import LoadSpec, load_pretrained, load_tokenizer
from rlhf_core.models.models import PPOModels
from rlhf_core.ppo.trainer import PPOTrainer
from rlhf_core.train.reward import encode_pairs, train_reward_model
from rlhf_core.train.sft import encode_sft_rows, train_sft

CPU = torch.device("cpu")
SFT_ROWS = [{"prompt": f"tell me about {w} :", "response": f"the {w} is good ."}
            for w in ["cats", "dogs", "rain", "sun", "trees", "cats and dogs", "the rain"]]
PREF_ROWS = [{"prompt": r["prompt"], "chosen": r["response"], "rejected": "no ."}
             for r in SFT_ROWS]


def _sft_data(tok, cfg):
    """(examples, pad id): what train_sft takes, of SFT_ROWS."""
    return encode_sft_rows(tok, SFT_ROWS, cfg.loss_on), tok.pad_token_id


class Interrupt(Exception):
    pass


def stop_at(step_to_stop: int):
    def on_log(step, metrics):
        if step == step_to_stop:
            raise Interrupt(step)
    return on_log


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_bits(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


# -- atomic saves and retention --------------------------------------------------------------
def test_atomic_dir_failure_keeps_previous_and_leaves_no_temp(tmp_path):
    target = tmp_path / "ckpt"
    with atomic_dir(target) as tmp:
        (tmp / "w").write_text("v1")
    with pytest.raises(RuntimeError), atomic_dir(target) as tmp:
        (tmp / "w").write_text("half")
        raise RuntimeError("crash while saving")
    assert (target / "w").read_text() == "v1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_atomic_dir_heals_a_crash_between_the_two_renames(tmp_path):
    target = tmp_path / "ckpt"
    old = tmp_path / ".ckpt.old"
    old.mkdir()
    (old / "w").write_text("v1")  # state after `target -> .old`, before `tmp -> target`
    with atomic_dir(target) as tmp:
        assert (target / "w").read_text() == "v1"  # restored before anything else
        (tmp / "w").write_text("v2")
    assert (target / "w").read_text() == "v2" and not old.exists()


def _tiny_state():
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
    return model, opt, sched


def test_checkpointer_keeps_last_n_and_ignores_partial_saves(tmp_path):
    model, opt, sched = _tiny_state()
    ck = Checkpointer(tmp_path, {"m": model}, every=1, keep_last=2)
    for step in (1, 2, 3):
        ck.save(step, opt, sched, None, {"n": step})
    assert [p.name for p in ck.checkpoints()] == ["step_00000002", "step_00000003"]
    (tmp_path / ".step_00000004.tmp").mkdir()  # a save killed before its rename
    (tmp_path / "step_00000005").mkdir()  # a folder without meta.json is not a checkpoint
    assert ck.latest().name == "step_00000003"
    with torch.no_grad():
        model.weight.zero_()
    step, extra = ck.restore(opt, sched, None)
    assert (step, extra) == (3, {"n": 3}) and model.weight.abs().sum() > 0


def test_checkpointer_due_never_on_the_last_step_and_off_when_zero(tmp_path):
    ck = Checkpointer(tmp_path, {}, every=2)
    assert [s for s in range(1, 7) if ck.due(s, 6)] == [2, 4]
    assert not any(Checkpointer(tmp_path, {}, every=0).due(s, 6) for s in range(1, 7))
    assert Checkpointer(tmp_path, {}, every=1).restore(None, None, None) is None


def test_state_file_loads_without_unpickling(tmp_path):
    model, opt, sched = _tiny_state()
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    sched.step()
    path = Checkpointer(tmp_path, {"m": model}, every=1).save(1, opt, sched,
                                                              torch.Generator(), {})
    state = torch.load(path / "state.pt", weights_only=True)  # raises on arbitrary objects
    assert set(state) == {"optimizer", "scheduler", "rng"}


def test_restore_with_a_new_lr_uses_it(tmp_path):
    model, opt, sched = _tiny_state()
    ck = Checkpointer(tmp_path, {"m": model}, every=1)
    opt.step()
    sched.step()
    ck.save(1, opt, sched, None, {})
    model2, opt2, sched2 = _tiny_state()
    ck2 = Checkpointer(tmp_path, {"m": model2}, every=1)
    ck2.restore(opt2, sched2, None, lr=0.01)
    assert sched2.base_lrs == [0.01]
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.01 * 0.5)  # factor at step 1


def test_rng_round_trip_covers_torch_numpy_python_and_generator():
    gen = torch.Generator().manual_seed(1)
    state = capture_rng(gen)
    first = (torch.rand(3), np.random.rand(3), random.random(), torch.rand(3, generator=gen))
    restore_rng(state, gen)
    again = (torch.rand(3), np.random.rand(3), random.random(), torch.rand(3, generator=gen))
    assert torch.equal(first[0], again[0]) and np.array_equal(first[1], again[1])
    assert first[2] == again[2] and torch.equal(first[3], again[3])


# -- resume == uninterrupted -----------------------------------------------------------------
def _sft_run(model_dir, tok, ck_root, on_log=None):
    torch.manual_seed(0)
    model = load_pretrained(model_dir, LoadSpec())
    cfg = SFTConfig(epochs=3, batch_size=3, log_every=1, optim=OptimConfig(lr=1e-2))
    ck = Checkpointer(ck_root, {"model": model}, every=2)
    train_sft(model, *_sft_data(tok, cfg), cfg, CPU,
              torch.Generator().manual_seed(0), on_log=on_log,
              progress=False, checkpointer=ck)
    return weights(model)


@pytest.mark.slow
def test_sft_resumed_mid_run_equals_uninterrupted_bit_for_bit(tiny_model_dir, tmp_path):
    tok = load_tokenizer(str(tiny_model_dir))
    reference = _sft_run(tiny_model_dir, tok, tmp_path / "a")  # 9 steps, 3 per pass
    with pytest.raises(Interrupt):
        _sft_run(tiny_model_dir, tok, tmp_path / "b", on_log=stop_at(5))  # mid-pass 2
    assert Checkpointer(tmp_path / "b", {}, 2).latest().name == "step_00000004"
    logged = []
    resumed = _sft_run(tiny_model_dir, tok, tmp_path / "b",
                       on_log=lambda s, m: logged.append(s))
    assert logged == [5, 6, 7, 8, 9]  # continues after the checkpoint, not from step 1
    assert_same_bits(reference, resumed)


def _rm_run(model_dir, tok, ck_root, on_log=None):
    torch.manual_seed(0)
    model = load_pretrained(model_dir, LoadSpec(), "new_head")
    cfg = RewardConfig(epochs=2, batch_size=2, log_every=1, optim=OptimConfig(lr=1e-2))
    ck = Checkpointer(ck_root, {"model": model}, every=3)
    train_reward_model(model, encode_pairs(tok, PREF_ROWS), None, tok.pad_token_id, cfg, CPU,
                       torch.Generator().manual_seed(1),
                       on_log=on_log, progress=False, checkpointer=ck)
    return weights(model)


@pytest.mark.slow
def test_reward_model_resumed_equals_uninterrupted_bit_for_bit(tiny_model_dir, tmp_path):
    tok = load_tokenizer(str(tiny_model_dir))
    reference = _rm_run(tiny_model_dir, tok, tmp_path / "a")
    with pytest.raises(Interrupt):
        _rm_run(tiny_model_dir, tok, tmp_path / "b", on_log=stop_at(5))
    assert_same_bits(reference, _rm_run(tiny_model_dir, tok, tmp_path / "b"))


def _ppo_trainer(model_dir, tok, adaptive=True):
    torch.manual_seed(0)
    policy, ref = load_pretrained(model_dir, LoadSpec()), load_pretrained(model_dir, LoadSpec())
    value, reward = load_pretrained(model_dir, LoadSpec(), "new_head"), \
        load_pretrained(model_dir, LoadSpec(), "new_head")
    cfg = PPOConfig(iterations=5, rollout_batch_size=4, num_minibatches=2, ppo_epochs=2,
                    max_new_tokens=6, optim=OptimConfig(lr=1e-3), adaptive_kl=adaptive,
                    kl_horizon=10, checkpoint_every=2)
    prompts = [encode(tok, r["prompt"]) for r in SFT_ROWS]
    return PPOTrainer(PPOModels(policy, ref, value, reward), tokenizer=tok, prompt_ids=prompts,
                      cfg=cfg, norm_stats={"mean": 0.0, "std": 1.0, "n": 1}, device=CPU,
                      generator=torch.Generator().manual_seed(0))


@pytest.mark.slow
def test_ppo_resumed_equals_uninterrupted_bit_for_bit(tiny_model_dir, tmp_path):
    tok = load_tokenizer(str(tiny_model_dir))
    ref_trainer = _ppo_trainer(tiny_model_dir, tok)
    ref_metrics = {}
    ref_trainer.train(lambda i, m, s: ref_metrics.setdefault(i, m), progress=False,
                      checkpointer=ref_trainer.checkpointer(tmp_path / "a"))

    def crash(i, m, s):
        if i == 3:
            raise Interrupt(i)

    first = _ppo_trainer(tiny_model_dir, tok)
    with pytest.raises(Interrupt):
        first.train(crash, progress=False, checkpointer=first.checkpointer(tmp_path / "b"))
    second = _ppo_trainer(tiny_model_dir, tok)
    seen = {}
    second.train(lambda i, m, s: seen.setdefault(i, m), progress=False,
                 checkpointer=second.checkpointer(tmp_path / "b"))
    assert sorted(seen) == [3, 4, 5]
    assert second.episode == ref_trainer.episode == 20
    assert second.kl_ctl.value == ref_trainer.kl_ctl.value != 0.05  # adaptive state resumed
    for i in (3, 4, 5):
        assert seen[i]["objective/kl"] == ref_metrics[i]["objective/kl"]
    assert_same_bits(weights(ref_trainer.policy), weights(second.policy))
    assert_same_bits(weights(ref_trainer.value_model), weights(second.value_model))


# -- fail safe -------------------------------------------------------------------------------
def test_non_finite_loss_names_the_step_and_keeps_the_last_good_checkpoint(tiny_model_dir,
                                                                           tmp_path):
    tok = load_tokenizer(str(tiny_model_dir))
    model = load_pretrained(tiny_model_dir, LoadSpec())
    calls = {"n": 0}
    real_forward = model.forward

    def poisoned(*args, **kwargs):
        calls["n"] += 1
        out = real_forward(*args, **kwargs)
        if calls["n"] == 3:
            out.logits = out.logits * float("nan")
        return out

    model.forward = poisoned
    cfg = SFTConfig(epochs=2, batch_size=3, optim=OptimConfig(lr=1e-2))
    ck = Checkpointer(tmp_path, {"model": model}, every=2)
    with pytest.raises(FloatingPointError, match="non-finite sft loss at step 3"):
        train_sft(model, *_sft_data(tok, cfg), cfg, CPU,
              torch.Generator().manual_seed(0),
                  progress=False, checkpointer=ck)
    good = ck.latest()
    assert good.name == "step_00000002"
    # after a config change (lower LR) the run continues from the last good checkpoint
    model2 = load_pretrained(tiny_model_dir, LoadSpec())
    logged = []
    train_sft(model2, *_sft_data(tok, cfg), cfg.model_copy(update={"optim": OptimConfig(lr=1e-3),
                                                            "log_every": 1}),
              CPU, torch.Generator().manual_seed(0), on_log=lambda s, m: logged.append((s, m)),
              progress=False, checkpointer=Checkpointer(tmp_path, {"model": model2}, every=2))
    assert [s for s, _ in logged] == [3, 4, 5, 6]
    assert all(torch.isfinite(p).all() for p in model2.parameters())
    assert logged[0][1]["train/lr"] <= 1e-3


def test_non_finite_reward_stops_ppo_naming_the_iteration(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    trainer = _ppo_trainer(tiny_model_dir, tok, adaptive=False)
    with torch.no_grad():
        trainer.reward_model.head.bias.fill_(float("inf"))
    with pytest.raises(FloatingPointError, match="non-finite reward-model score at step 1"):
        trainer.train(progress=False)


def _poison_gradients(model, from_forward: int) -> None:
    """Every gradient NaN once the model has run ``from_forward`` forward passes (the loss
    itself stays finite)."""
    calls = {"n": 0}
    model.register_forward_pre_hook(lambda *_: calls.__setitem__("n", calls["n"] + 1))
    for p in model.parameters():
        p.register_hook(lambda g: g * float("nan") if calls["n"] >= from_forward else g)


def test_non_finite_gradient_names_the_step_before_any_weight_changes(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    model = load_pretrained(tiny_model_dir, LoadSpec())
    cfg = SFTConfig(epochs=2, batch_size=3, optim=OptimConfig(lr=1e-2))
    _poison_gradients(model, from_forward=3)
    with pytest.raises(FloatingPointError, match="non-finite sft gradient norm at step 3"):
        train_sft(model, *_sft_data(tok, cfg), cfg, CPU,
              torch.Generator().manual_seed(0),
                  progress=False)
    assert all(torch.isfinite(p).all() for p in model.parameters())  # not applied


def test_non_finite_gradient_stops_ppo_naming_the_iteration(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    trainer = _ppo_trainer(tiny_model_dir, tok, adaptive=False)
    _poison_gradients(trainer.policy, from_forward=1)
    with pytest.raises(FloatingPointError, match="non-finite ppo gradient norm at step 1"):
        trainer.train(progress=False)
    assert all(torch.isfinite(p).all() for p in trainer.policy.parameters())
