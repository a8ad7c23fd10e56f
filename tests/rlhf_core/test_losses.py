"""Bradley-Terry and SFT losses against naive Python references."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf_core.models.data import IGNORE_INDEX
from rlhf_core.train.reward import bradley_terry_loss
from rlhf_core.train.sft import sft_loss

DTYPES = [torch.float32, torch.float64]
SEEDS = [0, 1, 2]


def _tol(dtype):
    return {"rel": 1e-5, "abs": 1e-6} if dtype == torch.float32 else \
        {"rel": 1e-10, "abs": 1e-12}


def _softplus(x):
    return max(x, 0.0) + math.log1p(math.exp(-abs(x)))


def _naive_bt(chosen, rejected, margin=None):
    margin = margin or [0.0] * len(chosen)
    return sum(_softplus(-(c - r - m)) for c, r, m in zip(chosen, rejected, margin)) / len(chosen)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("B", [1, 5, 16])
def test_bt_loss_and_stats_match_naive(dtype, seed, B):
    g = torch.Generator().manual_seed(seed)
    chosen = (torch.randn(B, generator=g) * 2).to(dtype)
    rejected = (torch.randn(B, generator=g) * 2).to(dtype)
    loss, stats = bradley_terry_loss(chosen, rejected)
    c, r = chosen.tolist(), rejected.tolist()
    assert loss.item() == pytest.approx(_naive_bt(c, r), **_tol(dtype))
    assert stats["accuracy"].item() == pytest.approx(sum(a > b for a, b in zip(c, r)) / B)
    assert stats["margin"].item() == pytest.approx(sum(a - b for a, b in zip(c, r)) / B,
                                                   **_tol(dtype))
    assert stats["chosen_reward"].item() == pytest.approx(sum(c) / B, **_tol(dtype))
    assert stats["rejected_reward"].item() == pytest.approx(sum(r) / B, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_bt_equal_rewards_give_log_two(dtype):
    x = torch.tensor([-3.0, 0.0, 2.5, 100.0], dtype=dtype)
    loss, stats = bradley_terry_loss(x, x.clone())
    assert loss.item() == pytest.approx(math.log(2), **_tol(dtype))
    assert stats["accuracy"].item() == 0.0  # a tie is not a correct ordering
    assert stats["margin"].item() == 0.0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_bt_margin_shifts_the_logit(dtype, seed):
    g = torch.Generator().manual_seed(seed)
    chosen = torch.randn(6, generator=g).to(dtype)
    rejected = torch.randn(6, generator=g).to(dtype)
    margin = torch.rand(6, generator=g).to(dtype)
    with_margin, stats_m = bradley_terry_loss(chosen, rejected, margin)
    shifted, _ = bradley_terry_loss(chosen - margin, rejected)
    plain, stats = bradley_terry_loss(chosen, rejected)
    assert with_margin.item() == pytest.approx(shifted.item(), **_tol(dtype))
    assert with_margin.item() == pytest.approx(
        _naive_bt(chosen.tolist(), rejected.tolist(), margin.tolist()), **_tol(dtype))
    assert with_margin.item() > plain.item()  # a positive margin demands a larger gap
    # the statistics describe the raw reward gap, not the margin-shifted one
    assert stats_m["margin"].item() == pytest.approx(stats["margin"].item())
    assert stats_m["accuracy"].item() == stats["accuracy"].item()


def test_bt_gradient_and_extremes():
    chosen = torch.tensor([1.0, -2.0], requires_grad=True)
    rejected = torch.tensor([0.0, 0.0], requires_grad=True)
    loss, _ = bradley_terry_loss(chosen, rejected)
    loss.backward()
    sig = [1 / (1 + math.exp(d)) for d in (1.0, -2.0)]  # sigmoid(-diff)
    assert chosen.grad.tolist() == pytest.approx([-s / 2 for s in sig])
    assert rejected.grad.tolist() == pytest.approx([s / 2 for s in sig])
    huge, _ = bradley_terry_loss(torch.tensor([200.0]), torch.tensor([-200.0]))
    assert huge.item() == pytest.approx(0.0, abs=1e-12)
    wrong, _ = bradley_terry_loss(torch.tensor([-200.0]), torch.tensor([200.0]))
    assert math.isfinite(wrong.item()) and wrong.item() == pytest.approx(400.0)


def test_bt_empty_batch_raises():
    with pytest.raises(ValueError):
        bradley_terry_loss(torch.zeros(0), torch.zeros(0))


# ----------------------------------------------------------------------------- SFT


def _naive_sft(logits, labels):
    """Per-position loop: logits at t predict labels at t + 1; -100 skipped."""
    total, n = 0.0, 0
    for lrow, yrow in zip(logits, labels):
        for t in range(len(yrow) - 1):
            y = yrow[t + 1]
            if y == IGNORE_INDEX:
                continue
            xs = lrow[t]
            m = max(xs)
            lse = m + math.log(sum(math.exp(x - m) for x in xs))
            total += lse - xs[y]
            n += 1
    return total / n, n


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", [(1, 2, 3), (3, 6, 7)])
def test_sft_loss_matches_naive(dtype, seed, shape):
    B, T, V = shape
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, T, V, generator=g) * 2).to(dtype)
    labels = torch.randint(0, V, (B, T), generator=g)
    ignore = torch.rand(B, T, generator=g) < 0.4
    labels[ignore] = IGNORE_INDEX
    labels[0, -1] = 1  # at least one supervised next-token
    loss, stats = sft_loss(logits, labels)
    exp_loss, exp_n = _naive_sft(logits.tolist(), labels.tolist())
    assert loss.item() == pytest.approx(exp_loss, rel=1e-5, abs=1e-6)
    assert int(stats["num_tokens"]) == exp_n
    assert stats["loss"].item() == pytest.approx(loss.item())


def test_sft_loss_ignores_unsupervised_positions_and_the_last_logit():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 4, generator=g)
    labels = torch.tensor([[IGNORE_INDEX, IGNORE_INDEX, 2, 3, 1],
                           [IGNORE_INDEX, 0, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]])
    base, stats = sft_loss(logits, labels)
    assert int(stats["num_tokens"]) == 4
    changed = logits.clone()
    changed[0, 0] += 50.0   # predicts labels[0, 1] = -100
    changed[1, 1:] -= 50.0  # predict only -100 labels
    changed[:, -1] = 99.0   # the last position predicts nothing
    torch.testing.assert_close(sft_loss(changed, labels)[0], base)
    changed[0, 1, 2] += 5.0  # predicts labels[0, 2] = 2 -> must change
    assert sft_loss(changed, labels)[0].item() < base.item()


def test_sft_loss_raises_when_nothing_is_supervised():
    logits = torch.randn(2, 4, 5)
    with pytest.raises(ValueError):
        sft_loss(logits, torch.full((2, 4), IGNORE_INDEX))
    only_first = torch.full((2, 4), IGNORE_INDEX)
    only_first[:, 0] = 3  # the first label is never a next-token target
    with pytest.raises(ValueError):
        sft_loss(logits, only_first)


def test_sft_loss_perfect_prediction_is_near_zero():
    labels = torch.tensor([[IGNORE_INDEX, 1, 2, 0]])
    logits = torch.full((1, 4, 3), -30.0)
    for t in range(3):
        logits[0, t, labels[0, t + 1]] = 30.0
    loss, _ = sft_loss(logits, labels)
    assert loss.item() == pytest.approx(0.0, abs=1e-10)


@pytest.mark.parametrize("loss_on", ["response", "all"])
def test_supervised_loss_equals_the_full_logits_loss_and_skips_prompt_positions(
        tiny_model_dir, loss_on):
    from rlhf_core.models.loader import LoadSpec, load_pretrained
    from rlhf_core.train.sft import sft_batch, supervised_loss
    from tests.conftest import encode_sft, make_tokenizer

    tok = make_tokenizer()
    rows = [("tell me about cats please", "sure ."), ("hello world", "the sun is nice !"),
            ("tell me about dogs and the rain please", "good")]
    batch = sft_batch([encode_sft(tok, p, r, loss_on) for p, r in rows], tok.pad_token_id, "cpu")
    ids, mask, labels = batch
    model = load_pretrained(tiny_model_dir, LoadSpec()).double()
    seen = []
    model.get_output_embeddings().register_forward_hook(
        lambda _m, args, _out: seen.append(args[0].shape[1]))
    loss, stats = supervised_loss(model, ids, mask, labels)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    full = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    want, want_stats = sft_loss(full, labels)
    want.backward()
    assert loss.item() == pytest.approx(want.item(), rel=1e-12)
    assert int(stats["num_tokens"]) == int(want_stats["num_tokens"])
    for got, expected in zip(grads, (p.grad for p in model.parameters())):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    # the shortest prompt has 2 words: its first response label sits at 2, predicted from 1
    first = 1 if loss_on == "response" else 0
    assert seen[0] == ids.shape[1] - first


def test_supervised_loss_raises_when_nothing_is_supervised(tiny_model_dir):
    from rlhf_core.models.loader import LoadSpec, load_pretrained
    from rlhf_core.train.sft import supervised_loss

    model = load_pretrained(tiny_model_dir, LoadSpec())
    ids = torch.tensor([[3, 4, 5]])
    with pytest.raises(ValueError, match="no supervised token"):
        supervised_loss(model, ids, ids != 0, torch.full_like(ids, IGNORE_INDEX))
