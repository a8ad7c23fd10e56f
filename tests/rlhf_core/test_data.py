import json

import pytest
import torch

from rlhf_core.models.data import (
    IGNORE_INDEX,
    ShuffledBatches,
    last_real_index,
    left_pad,
    right_pad,
)
from tests.conftest import encode_pair, encode_sft, make_tokenizer


def test_encode_sft_appends_eos_and_masks_prompt():
    tok = make_tokenizer()
    ids, labels = encode_sft(tok, "tell me about cats :", "cats are nice .")
    n_prompt = 5
    assert ids[-1] == tok.eos_token_id
    assert labels[:n_prompt] == [IGNORE_INDEX] * n_prompt
    assert labels[n_prompt:] == ids[n_prompt:]
    _, labels_all = encode_sft(tok, "tell me about cats :", "cats are nice .", loss_on="all")
    assert labels_all == ids


def test_encode_pair_shares_prompt_and_ends_with_eos():
    tok = make_tokenizer()
    c, r = encode_pair(tok, "hello :", "good", "bad bad")
    assert c[0] == r[0] and c[-1] == r[-1] == tok.eos_token_id and len(r) == len(c) + 1


def test_padding_sides():
    assert left_pad([[1, 2], [3]], 0).tolist() == [[1, 2], [0, 3]]
    assert right_pad([[1, 2], [3]], 0).tolist() == [[1, 2], [3, 0]]
    with pytest.raises(ValueError):
        left_pad([], 0)


def test_last_real_index_and_all_padding_error():
    ids = torch.tensor([[4, 5, 9, 0], [4, 9, 0, 0]])
    assert last_real_index(ids, 0).tolist() == [2, 1]
    with pytest.raises(ValueError, match="all padding"):
        last_real_index(torch.zeros(1, 3, dtype=torch.long), 0)


def _take(sampler, n):
    return [sampler.next().tolist() for _ in range(n)]


def test_shuffled_batches_cover_every_index_once_per_pass_and_reproduce():
    a = _take(ShuffledBatches(10, 4, torch.Generator().manual_seed(3)), 6)
    b = _take(ShuffledBatches(10, 4, torch.Generator().manual_seed(3)), 6)
    assert a == b and [len(x) for x in a] == [4, 4, 2, 4, 4, 2]
    assert sorted(sum(a[:3], [])) == list(range(10)) == sorted(sum(a[3:], []))
    assert a[:3] != a[3:]  # reshuffled every pass


def test_shuffled_batches_resume_from_state_mid_pass():
    gen = torch.Generator().manual_seed(5)
    ref = _take(ShuffledBatches(10, 4, gen), 7)
    gen = torch.Generator().manual_seed(5)
    first = ShuffledBatches(10, 4, gen)
    head = _take(first, 2)
    state, gen_state = first.state_dict(), gen.get_state()
    gen2 = torch.Generator()
    gen2.set_state(gen_state)
    second = ShuffledBatches(10, 4, gen2)
    second.load_state_dict(state)
    assert head + _take(second, 5) == ref


def test_shuffled_batches_rejects_empty():
    with pytest.raises(ValueError, match="no examples"):
        ShuffledBatches(0, 4, torch.Generator())


def _one_at_a_time(n: int, count: int, rounds: int, gen: torch.Generator) -> list[list[int]]:
    """Naive reference of a prompt stream: one index at a time, reshuffle when a pass ends."""
    order, cursor, out = [], 0, []
    for _ in range(rounds):
        batch = []
        while len(batch) < count:
            if cursor >= len(order):
                order, cursor = torch.randperm(n, generator=gen).tolist(), 0
            batch.append(order[cursor])
            cursor += 1
        out.append(batch)
    return out


@pytest.mark.parametrize("n,count", [(10, 4), (3, 7), (5, 5)])
def test_take_runs_on_into_the_next_pass_like_the_naive_stream(n, count):
    ref = _one_at_a_time(n, count, 6, torch.Generator().manual_seed(9))
    stream = ShuffledBatches(n, count, torch.Generator().manual_seed(9))
    got = [stream.take(count).tolist() for _ in range(6)]
    assert got == ref and all(len(b) == count for b in got)
    assert stream.take(0).tolist() == []


def test_take_resumes_from_state_across_a_pass_boundary():
    ref = ShuffledBatches(10, 4, torch.Generator().manual_seed(2))
    expected = [ref.take(4).tolist() for _ in range(5)]
    gen = torch.Generator().manual_seed(2)
    first = ShuffledBatches(10, 4, gen)
    head = [first.take(4).tolist() for _ in range(3)]  # 12 indices: 2 into the second pass
    gen2 = torch.Generator()
    gen2.set_state(gen.get_state())
    second = ShuffledBatches(10, 4, gen2)
    second.load_state_dict(first.state_dict())
    assert head + [second.take(4).tolist() for _ in range(2)] == expected


def test_the_saved_position_is_small_at_any_size_and_resumes_the_same_order():
    gen = torch.Generator().manual_seed(4)
    big = ShuffledBatches(1_000_000, 8, gen)
    head = [big.next() for _ in range(3)]
    state = big.state_dict()
    assert len(json.dumps(state)) < 8_000  # the generator's state, not 1M indices
    again = ShuffledBatches(1_000_000, 8, torch.Generator().manual_seed(99))
    again.load_state_dict(json.loads(json.dumps(state)))
    assert torch.equal(again.order, big.order) and again.cursor == 24 == big.cursor
    assert torch.equal(torch.cat(head), big.order[:24]) and again.passes == 1
    fresh = ShuffledBatches(10, 4, torch.Generator())
    fresh.load_state_dict(ShuffledBatches(10, 4, torch.Generator()).state_dict())
    assert fresh.pass_state is None and len(fresh.order) == 0  # nothing drawn yet


def test_an_old_checkpoint_with_the_whole_order_still_resumes():
    gen = torch.Generator().manual_seed(5)
    ref = _take(ShuffledBatches(10, 4, gen), 5)
    gen = torch.Generator().manual_seed(5)
    first = ShuffledBatches(10, 4, gen)
    head = _take(first, 2)
    old = {"order": first.order.tolist(), "cursor": first.cursor}  # the form before issue 37
    gen2 = torch.Generator()
    gen2.set_state(gen.get_state())
    second = ShuffledBatches(10, 4, gen2)
    second.load_state_dict(old)
    assert head + _take(second, 3) == ref


def test_a_saved_position_over_other_data_is_refused():
    stream = ShuffledBatches(10, 4, torch.Generator().manual_seed(1))
    stream.next()
    with pytest.raises(ValueError, match="covers 10 examples, this data has 12"):
        ShuffledBatches(12, 4, torch.Generator()).load_state_dict(stream.state_dict())
