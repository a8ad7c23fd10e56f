"""rlhf_core/memory.py: freed heap memory goes back to the OS, and the loops' trimmer calls it
at most once per interval."""

import sys

import pytest

import rlhf_core.memory as memory

FRAGMENTED = """
import rlhf_core.memory as memory

def rss_anon_mb():
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) / 1024 for line in fh if line.startswith("RssAnon:"))

big, small = [], []
for i in range(2_000):  # 100 KB blocks (glibc's heap, under its mmap threshold), each
    big.append(b"x" * 100_000)  # followed by a live small block: none can merge to the top
    small.append(b"y" * 600 + bytes([i % 256]))
del big
held = rss_anon_mb()
assert memory.trim_heap() is True
print(held - rss_anon_mb(), len(small))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or memory._MALLOC_TRIM is None,
                    reason="glibc only")
def test_trim_heap_returns_the_free_chunks_between_live_ones_to_the_os():
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]  # a fresh process: a heap of known shape
    out = subprocess.run([sys.executable, "-c", FRAGMENTED], cwd=root, capture_output=True,
                         text=True, check=True, env={"PYTHONPATH": str(root)}).stdout.split()
    assert float(out[0]) > 100 and out[1] == "2000"  # of the 190 MB freed, most goes back


def test_the_trimmer_trims_when_the_resident_set_grew_and_at_most_once_per_interval(
        monkeypatch):
    calls, rss = [], [1000 * 2**20]
    monkeypatch.setattr(memory, "_MALLOC_TRIM", lambda n: 0)
    monkeypatch.setattr(memory, "trim_heap", lambda: calls.append(1) or True)
    monkeypatch.setattr(memory, "resident_bytes", lambda: rss[0])
    trimmer = memory.HeapTrimmer(every_s=0.0, grow_mb=100)
    trimmer.tick()
    rss[0] += 50 * 2**20  # grew, under the margin
    trimmer.tick()
    assert calls == []
    rss[0] += 60 * 2**20  # 110 MB over the first look
    trimmer.tick()
    assert calls == [1]
    trimmer.tick()  # the base is now the look after the trim
    assert calls == [1]
    rarely = memory.HeapTrimmer(every_s=3600.0, grow_mb=100)
    rss[0] += 500 * 2**20
    for _ in range(100):
        rarely.tick()
    assert calls == [1]


def test_sft_eval_loss_over_a_few_rows_at_a_time_is_the_same_mean(tiny_model_dir, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM

    import rlhf_core.train.sft as sft
    from tests.conftest import make_tokenizer

    tok = make_tokenizer()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    rows = [{"prompt": f"tell me about {w} :", "response": "the " + " ".join([w] * n) + " ."}
            for n, w in enumerate(["cats", "dogs", "rain", "sun", "cats and dogs"], 1)]
    examples = sft.encode_sft_rows(tok, rows, "response")
    whole = sft.sft_eval_loss(model, examples, tok.pad_token_id, torch.device("cpu"))
    calls = []
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda **kw: calls.append(
        kw["input_ids"].shape[0]) or forward(**kw))
    monkeypatch.setattr(sft, "EVAL_LOGITS_BYTES", 1)  # one row a pass
    apart = sft.sft_eval_loss(model, examples, tok.pad_token_id, torch.device("cpu"))
    assert calls == [1] * len(examples)
    assert apart == pytest.approx(whole, rel=1e-5)
    assert model.training
