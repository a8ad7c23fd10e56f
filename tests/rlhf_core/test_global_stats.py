"""Global (all-reduced) whitening, reward-normalisation statistics and logged means: 2 CPU
processes on the gloo backend, each holding an unequal shard of one batch, get what one
process gets on the whole batch; without a process group the functions are the
single-process ones, bit for bit."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rlhf_core.masked import masked_mean, masked_var, masked_whiten
from rlhf_core.models.scoring import reward_norm_stats
from rlhf_core.parallel.global_stats import (
    global_masked_var,
    global_masked_whiten,
    global_reward_norm_stats,
    global_weighted_means,
    world_size,
)

ROWS = (3, 5)  # rank 0 holds rows 0-2, rank 1 rows 3-7 of an [8, 6] batch
N_SCORES = (5, 8)


def _batch(seed: int = 0, empty_rows: slice | None = None):
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(sum(ROWS), 6, generator=g) * 2 + 0.5
    mask = torch.rand(sum(ROWS), 6, generator=g) < 0.7
    mask[:, 0] = True
    if empty_rows is not None:
        mask[empty_rows] = False
    return values, mask


def _scores():
    return torch.randn(sum(N_SCORES), generator=torch.Generator().manual_seed(1)) * 3 - 1


def _shard(t: torch.Tensor, sizes: tuple[int, ...], rank: int) -> torch.Tensor:
    return t.split(list(sizes))[rank]


def _error(call) -> str | None:
    """The ValueError ``call`` raises (None if none): every rank must raise, none wait."""
    try:
        call()
    except ValueError as err:
        return str(err)
    return None


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=len(ROWS))
    try:
        values, mask = _batch()
        v, m = _shard(values, ROWS, rank), _shard(mask, ROWS, rank)
        # rank 1's rows all masked out: its shard is empty, the global batch is not
        ev, em = (_shard(t, ROWS, rank) for t in _batch(empty_rows=slice(ROWS[0], None)))
        out = {
            "world": world_size(),
            "adv": global_masked_whiten(v, m),
            "rew": global_masked_whiten(v, m, shift_mean=False),
            "var": global_masked_var(v, m),
            "empty_shard": global_masked_whiten(ev, em),
            "stats": global_reward_norm_stats(_shard(_scores(), N_SCORES, rank)),
        }
        # per-token means of this shard, weighted by its token count
        out["means"] = global_weighted_means(
            {"mean": float(masked_mean(v, m)), "mean_sq": float(masked_mean(v * v, m))},
            weight=float(m.sum()))
        out["empty_error"] = _error(lambda: global_masked_whiten(v, torch.zeros_like(m)))
        out["keys_error"] = _error(lambda: global_weighted_means({f"only_rank{rank}": 1.0}, 1.0))
        torch.save(out, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gloo")
    mp.spawn(_worker, args=(str(tmp / "init"), str(tmp)), nprocs=len(ROWS), join=True)
    return [torch.load(tmp / f"rank{r}.pt") for r in range(len(ROWS))]


def test_two_ranks_whiten_like_one_process_on_the_global_batch(two_ranks):
    values, mask = _batch()
    assert [out["world"] for out in two_ranks] == [2, 2]
    for key, shift in (("adv", True), ("rew", False)):
        merged = torch.cat([out[key] for out in two_ranks])
        torch.testing.assert_close(merged, masked_whiten(values, mask, shift_mean=shift),
                                   rtol=1e-5, atol=1e-6)
    for out in two_ranks:
        torch.testing.assert_close(out["var"], masked_var(values, mask), rtol=1e-6, atol=0)
    # per-rank whitening (what N independent processes would do) is not the same update
    local = masked_whiten(_shard(values, ROWS, 0), _shard(mask, ROWS, 0))
    assert (local - two_ranks[0]["adv"]).abs().max() > 1e-2


def test_a_rank_with_an_empty_shard_uses_the_global_statistics(two_ranks):
    values, mask = _batch(empty_rows=slice(ROWS[0], None))
    merged = torch.cat([out["empty_shard"] for out in two_ranks])
    torch.testing.assert_close(merged, masked_whiten(values, mask), rtol=1e-5, atol=1e-6)
    assert not two_ranks[1]["empty_shard"].any()


def test_an_empty_global_mask_raises_on_every_rank(two_ranks):
    assert all("empty mask" in (out["empty_error"] or "") for out in two_ranks)


def test_logged_means_of_shards_are_the_global_batch_means(two_ranks):
    values, mask = _batch()
    for out in two_ranks:
        assert out["means"]["mean"] == pytest.approx(float(masked_mean(values, mask)), rel=1e-6)
        assert out["means"]["mean_sq"] == pytest.approx(
            float(masked_mean(values * values, mask)), rel=1e-6)
    # the unweighted mean of the two shard means is another number
    shard_means = [float(masked_mean(_shard(values, ROWS, r), _shard(mask, ROWS, r)))
                   for r in range(2)]
    assert abs(sum(shard_means) / 2 - two_ranks[0]["means"]["mean"]) > 1e-3


def test_ranks_logging_different_metrics_all_raise(two_ranks):
    for out in two_ranks:
        assert "only_rank0" in out["keys_error"] and "only_rank1" in out["keys_error"]


def test_reward_norm_stats_of_shards_equal_the_whole_sets(two_ranks):
    expected = reward_norm_stats(_scores())
    for out in two_ranks:
        assert out["stats"]["n"] == expected["n"] == sum(N_SCORES)
        assert out["stats"]["mean"] == pytest.approx(expected["mean"], rel=1e-12, abs=1e-12)
        assert out["stats"]["std"] == pytest.approx(expected["std"], rel=1e-12)


def test_without_a_process_group_they_are_the_single_process_functions():
    values, mask = _batch()
    assert world_size() == 1
    assert torch.equal(global_masked_whiten(values, mask), masked_whiten(values, mask))
    assert torch.equal(global_masked_whiten(values, mask, shift_mean=False),
                       masked_whiten(values, mask, shift_mean=False))
    assert torch.equal(global_masked_var(values, mask), masked_var(values, mask))
    assert global_reward_norm_stats(_scores()) == reward_norm_stats(_scores())
    assert global_weighted_means({"a": 1.5}, weight=3.0) == {"a": 1.5}
    with pytest.raises(ValueError, match="empty mask"):
        global_masked_whiten(values, torch.zeros_like(mask))
