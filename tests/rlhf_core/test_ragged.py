"""Id lists held flat (rlhf_core/models/ragged.py) and the SFT / reward-model examples built
from them on demand: each equal to the per-text encoding (encode_sft / encode_pair) and to a
naive reference, across chunk boundaries and slices."""

import random

import numpy as np
import pytest
import torch

from rlhf_core.models.data import IGNORE_INDEX, encode
from rlhf_core.models.ragged import Joined, RaggedIds
from rlhf_core.train.reward import PairExamples, encode_pairs
from rlhf_core.train.sft import SFTExamples, encode_sft_rows, sft_batch
from tests.conftest import WORDS, encode_pair, encode_sft, make_tokenizer


def _lists(n: int, seed: int, empty_every: int = 5) -> list[list[int]]:
    rng = random.Random(seed)
    return [[] if i % empty_every == 0 else [rng.randrange(50) for _ in range(rng.randrange(1, 9))]
            for i in range(n)]


def _chunked(lists: list[list[int]], sizes: list[int]) -> RaggedIds:
    """The lists split into chunks of ``sizes`` rows, int32 like an Arrow column."""
    chunks, at = [], 0
    for size in sizes:
        part = lists[at: at + size]
        at += size
        offsets = np.cumsum([0] + [len(x) for x in part]).astype(np.int32)
        values = np.array([v for x in part for v in x], dtype=np.int32)
        values.flags.writeable = False  # like a mapped file's buffers
        chunks.append((values, offsets))
    return RaggedIds(chunks)


@pytest.mark.parametrize("sizes", [[23], [1, 22], [7, 0, 9, 7], [10, 13]])
def test_rows_and_slices_match_the_lists_across_chunk_boundaries(sizes):
    lists = _lists(23, seed=len(sizes))
    ids = _chunked(lists, sizes)
    assert len(ids) == 23
    assert [ids[i] for i in range(23)] == lists
    assert ids[-1] == lists[-1] and all(type(v) is int for v in ids[3])
    for a, b in [(0, 23), (3, 17), (9, 10), (12, 12), (5, 40)]:
        assert list(ids[a:b]) == lists[a:b], (a, b)
        assert ids[a:b].lengths().tolist() == [len(x) for x in lists[a:b]]
    assert list(ids[::2]) == lists[::2]
    with pytest.raises(IndexError):
        ids[23]


def test_from_lists_and_joined_rows():
    a, b = _lists(11, 1), _lists(11, 2, empty_every=3)
    ra, rb = RaggedIds.from_lists(a), RaggedIds.from_lists(b)
    assert list(ra) == a and len(RaggedIds.from_lists([])) == 0
    joined = Joined([ra, rb], [99])
    assert [joined[i] for i in range(11)] == [x + y + [99] for x, y in zip(a, b)]
    assert list(joined[4:7]) == [x + y + [99] for x, y in zip(a[4:7], b[4:7])]
    with pytest.raises(ValueError, match="unequal"):
        Joined([ra, rb[:3]])


def _sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["" if i % 7 == 3 else " ".join(rng.choice(WORDS) for _ in range(rng.randrange(1, 8)))
            for i in range(n)]


@pytest.mark.parametrize("loss_on", ["response", "all"])
def test_sft_examples_from_ids_are_encode_sft_and_count_the_supervised_tokens(loss_on):
    tok = make_tokenizer()
    rows = [{"prompt": p, "response": r} for p, r in zip(_sentences(30, 1), _sentences(30, 2))]
    built = SFTExamples(_chunked([encode(tok, r["prompt"]) for r in rows], [8, 8, 14]),
                        _chunked([encode(tok, r["response"]) for r in rows], [30]),
                        tok.eos_token_id, loss_on)
    expected = [encode_sft(tok, r["prompt"], r["response"], loss_on) for r in rows]
    assert [built[i] for i in range(30)] == expected
    assert list(encode_sft_rows(tok, rows, loss_on)) == expected
    naive = [sum(label != IGNORE_INDEX for label in e[1][1:]) for e in expected]
    assert built.supervised_tokens().tolist() == naive
    idx = [4, 0, 29, 3]
    for got, want in zip(sft_batch([built[i] for i in idx], tok.pad_token_id, "cpu"),
                         sft_batch([expected[i] for i in idx], tok.pad_token_id, "cpu")):
        assert torch.equal(got, want)


def test_pair_examples_from_ids_are_encode_pair():
    tok = make_tokenizer()
    texts = [_sentences(20, s) for s in (3, 4, 5)]
    rows = [{"prompt": p, "chosen": c, "rejected": r} for p, c, r in zip(*texts)]
    ids = [_chunked([encode(tok, t) for t in col], [6, 14]) for col in texts]
    pairs = PairExamples(*ids, tok.eos_token_id)
    expected = [encode_pair(tok, r["prompt"], r["chosen"], r["rejected"]) for r in rows]
    assert [pairs[i] for i in range(20)] == expected
    assert list(pairs[5:9]) == expected[5:9]
    assert list(encode_pairs(tok, rows)) == expected
