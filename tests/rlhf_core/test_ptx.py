"""InstructGPT's pretraining mix (PPO-ptx): the language-model loss against a token-by-token
reference and on edge cases, ``ptx_coef: 0`` bit-identical to a run without the text, the term
logged as the loss of the chunks the stream drew, and a run killed mid-PPO with the mix on
resuming to the uninterrupted weights."""

from __future__ import annotations

import pytest
import torch

from rlhf_core.config import OptimConfig, PPOConfig
from rlhf_core.models.data import encode, right_pad
from rlhf_core.models.loader import LoadSpec, load_pretrained, load_tokenizer
from rlhf_core.models.models import PPOModels
from rlhf_core.ppo.trainer import PPOTrainer
from rlhf_core.train.ptx import PretrainMix, chunk_ids, lm_loss
from tests.shared import Interrupt, assert_same_bits, weights

CPU = torch.device("cpu")
SFT_ROWS = [{"prompt": f"tell me about {w} :"} for w in
            ["cats", "dogs", "rain", "sun", "trees", "cats and dogs", "the rain"]]
TEXT = ["the rain is nice and the cats are good .", "dogs are fun .", "tell me about trees"]


def test_lm_loss_matches_a_token_by_token_reference():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 7)
    ids = torch.randint(0, 7, (3, 5))
    lengths = [5, 2, 3]
    mask = torch.tensor([[t < n for t in range(5)] for n in lengths])
    total, count = 0.0, 0
    for b, n in enumerate(lengths):
        for t in range(1, n):
            total -= float(torch.log_softmax(logits[b, t - 1].double(), -1)[ids[b, t]])
            count += 1
    assert float(lm_loss(logits, ids, mask)) == pytest.approx(total / count, rel=1e-6)


def test_lm_loss_refuses_rows_with_nothing_to_predict():
    with pytest.raises(ValueError, match="no token to predict"):
        lm_loss(torch.zeros(2, 3, 4), torch.zeros(2, 3, dtype=torch.long),
                torch.tensor([[True, False, False], [False, False, False]]))


def test_chunks_cut_each_text_and_drop_single_tokens():
    assert chunk_ids([[1, 2, 3, 4, 5], [6], [7, 8]], 2) == [[1, 2], [3, 4], [7, 8]]
    with pytest.raises(ValueError):
        chunk_ids([[1, 2]], 1)
    with pytest.raises(ValueError, match="needs pretraining text"):
        PretrainMix([], 2, 0, torch.Generator())


def _trainer(model_dir, tok, coef=0.0, pretrain=None, checkpoint_every=0):
    torch.manual_seed(0)
    policy, ref = load_pretrained(model_dir, LoadSpec()), load_pretrained(model_dir, LoadSpec())
    value, reward = load_pretrained(model_dir, LoadSpec(), "new_head"), \
        load_pretrained(model_dir, LoadSpec(), "new_head")
    cfg = PPOConfig(iterations=4, rollout_batch_size=4, num_minibatches=2, ppo_epochs=2,
                    max_new_tokens=6, optim=OptimConfig(lr=1e-3), ptx_coef=coef,
                    ptx_batch_size=2, checkpoint_every=checkpoint_every)
    prompts = [encode(tok, r["prompt"]) for r in SFT_ROWS]
    return PPOTrainer(PPOModels(policy, ref, value, reward), tokenizer=tok, prompt_ids=prompts,
                      cfg=cfg, norm_stats={"mean": 0.0, "std": 1.0, "n": 1}, device=CPU,
                      generator=torch.Generator().manual_seed(0), pretrain_ids=pretrain)


def _chunks(tok):
    return chunk_ids([encode(tok, t) + [tok.eos_token_id] for t in TEXT], 4)


def test_ptx_coef_zero_is_bit_identical_to_no_text(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    timeless = ("time/", "throughput/")  # wall clocks differ run to run
    plain = _trainer(tiny_model_dir, tok)  # each seeds the global stream sampling draws from
    a = [{k: v for k, v in plain.step()[0].items() if not k.startswith(timeless)}
         for _ in range(2)]
    zero = _trainer(tiny_model_dir, tok, 0.0, _chunks(tok))
    b = [{k: v for k, v in zero.step()[0].items() if not k.startswith(timeless)}
         for _ in range(2)]
    assert zero.ptx is None and a == b and "ptx/loss" not in a[0]
    assert_same_bits(weights(plain.policy), weights(zero.policy))


def test_the_mix_logs_the_lm_loss_of_the_chunks_it_drew_and_changes_the_update(
        tiny_model_dir, monkeypatch):
    tok = load_tokenizer(str(tiny_model_dir))
    chunks = _chunks(tok)
    plain = _trainer(tiny_model_dir, tok)
    plain.step()
    mixed = _trainer(tiny_model_dir, tok, 2.0, chunks)
    drawn, real_loss = [], PretrainMix.loss

    def spy(self, model):
        import copy

        before = copy.deepcopy(self.stream)  # its generator too: the draw is replayed
        out = real_loss(self, model)
        rows = [chunks[i] for i in before.take(self.batch_size).tolist()]
        ids = right_pad(rows, tok.pad_token_id)
        mask = torch.tensor([[t < len(r) for t in range(ids.shape[1])] for r in rows])
        with torch.no_grad():
            naive = lm_loss(model(input_ids=ids, attention_mask=mask.long()).logits, ids, mask)
        drawn.append((float(out), float(naive)))
        return out

    monkeypatch.setattr(PretrainMix, "loss", spy)
    metrics, _ = mixed.step()
    assert len(drawn) == 4  # 2 epochs x 2 minibatches x 1 micro-batch
    assert all(a == pytest.approx(b, rel=1e-5) for a, b in drawn), drawn
    # each minibatch's token share weighs its micro-batch; the mean lies among the draws
    assert min(a for a, _ in drawn) - 1e-6 <= metrics["ptx/loss"] <= max(a for a, _ in drawn)
    assert any(not torch.equal(a, b) for a, b in zip(weights(plain.policy).values(),
                                                     weights(mixed.policy).values()))


@pytest.mark.slow
def test_a_run_with_the_mix_resumes_to_the_uninterrupted_weights(tiny_model_dir, tmp_path):
    tok = load_tokenizer(str(tiny_model_dir))
    chunks = _chunks(tok)
    ref = _trainer(tiny_model_dir, tok, 1.0, chunks, checkpoint_every=2)
    ref.train(lambda i, m, s: None, progress=False, checkpointer=ref.checkpointer(tmp_path / "a"))

    def crash(i, m, s):
        if i == 3:
            raise Interrupt(i)

    first = _trainer(tiny_model_dir, tok, 1.0, chunks, checkpoint_every=2)
    with pytest.raises(Interrupt):
        first.train(crash, progress=False, checkpointer=first.checkpointer(tmp_path / "b"))
    second = _trainer(tiny_model_dir, tok, 1.0, chunks, checkpoint_every=2)
    seen = {}
    second.train(lambda i, m, s: seen.setdefault(i, m), progress=False,
                 checkpointer=second.checkpointer(tmp_path / "b"))
    assert sorted(seen) == [3, 4] and all("ptx/loss" in m for m in seen.values())
    assert second.ptx.stream.state_dict() == ref.ptx.stream.state_dict()
    assert_same_bits(weights(ref.policy), weights(second.policy))


# the same mix in SFT: one pretraining batch per optimizer step

def _sft(model_dir, tok, coef=0.0, pretrain=None, root=None, on_log=None, steps=4):
    from rlhf_core.config import SFTConfig
    from rlhf_core.models.checkpoint import Checkpointer
    from rlhf_core.train.sft import encode_sft_rows, train_sft

    torch.manual_seed(0)
    model = load_pretrained(model_dir, LoadSpec())
    rows = [{"prompt": r["prompt"], "response": "they are nice ."} for r in SFT_ROWS]
    cfg = SFTConfig(epochs=steps * 2 / len(rows), batch_size=2, ptx_coef=coef,
                    ptx_batch_size=2, log_every=1, checkpoint_every=2 if root else 0,
                    optim=OptimConfig(lr=1e-3))
    ck = Checkpointer(root, {"model": model}, 2) if root else None
    last = train_sft(model, encode_sft_rows(tok, rows, "response"), tok.pad_token_id, cfg, CPU,
                     torch.Generator().manual_seed(0), on_log=on_log, progress=False,
                     checkpointer=ck, pretrain_ids=pretrain)
    return model, last


def test_sft_ptx_coef_zero_is_bit_identical_to_no_text(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    plain, a = _sft(tiny_model_dir, tok)
    zero, b = _sft(tiny_model_dir, tok, 0.0, _chunks(tok))
    assert "ptx/loss" not in b and a["train/loss"] == b["train/loss"]
    assert_same_bits(weights(plain), weights(zero))


def test_sft_mix_adds_coef_times_the_lm_loss_of_the_drawn_chunks(tiny_model_dir, monkeypatch):
    from rlhf_core.train import sft as sft_module

    tok = load_tokenizer(str(tiny_model_dir))
    chunks = _chunks(tok)
    seen, real_loss, real_sft = [], PretrainMix.loss, sft_module.sft_loss

    def spy_ptx(self, model):
        out = real_loss(self, model)
        seen.append(("ptx", float(out)))
        return out

    def spy_sft(logits, labels):
        loss, stats = real_sft(logits, labels)
        seen.append(("sft", float(loss)))
        return loss, stats

    monkeypatch.setattr(PretrainMix, "loss", spy_ptx)
    monkeypatch.setattr(sft_module, "sft_loss", spy_sft)
    logged = {}
    mixed, last = _sft(tiny_model_dir, tok, 3.0, chunks,
                       on_log=lambda step, m: logged.setdefault(step, dict(m)))
    steps = len(logged)  # log_every 1: one entry per optimizer step
    assert steps >= 4 and [k for k, _ in seen] == ["sft", "ptx"] * steps  # one batch per step
    for step in range(1, steps + 1):
        sft, ptx = seen[2 * step - 2][1], seen[2 * step - 1][1]
        assert logged[step]["ptx/loss"] == pytest.approx(ptx, rel=1e-6)
        assert logged[step]["train/loss"] == pytest.approx(sft + 3.0 * ptx, rel=1e-5)
    plain, _ = _sft(tiny_model_dir, tok)
    assert any(not torch.equal(a, b) for a, b in zip(weights(plain).values(),
                                                     weights(mixed).values()))


def test_sft_with_the_mix_resumes_to_the_uninterrupted_weights(tiny_model_dir, tmp_path):
    tok = load_tokenizer(str(tiny_model_dir))
    chunks = _chunks(tok)
    ref, _ = _sft(tiny_model_dir, tok, 1.0, chunks, root=tmp_path / "a")

    def crash(step, metrics):
        if step == 3:
            raise Interrupt(step)

    with pytest.raises(Interrupt):
        _sft(tiny_model_dir, tok, 1.0, chunks, root=tmp_path / "b", on_log=crash)
    resumed, _ = _sft(tiny_model_dir, tok, 1.0, chunks, root=tmp_path / "b")
    assert_same_bits(weights(ref), weights(resumed))
