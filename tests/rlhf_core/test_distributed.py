"""Data-parallel SFT and reward-model steps: 2 gloo ranks on a global batch make the update
1 process makes on the same global batch (loss, logged metrics and weights within 1e-5),
with unequal shards (3 and 2 rows of different response lengths) and a last global batch
of one row, where rank 1's shard is empty. Stopped after a step and resumed from rank 0's
checkpoint, 2 ranks end with the uninterrupted 2-rank weights bit for bit; 1 process
refuses that checkpoint, naming the world size it was written with."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rlhf_core.parallel.distributed import DataParallel
from tests.servers import free_port
from tests.shared import dp_initial, dp_train

# (stage, batch_size): 5 rows in one global batch (shards 3 + 2); 5 rows in batches of 4 and 1
CASES = (("sft", 5), ("sft", 4), ("reward_model", 5))


def _rank(rank: int, world: int, port: int, model_dir: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                           world_size=world)
    torch.set_num_threads(1)
    try:
        dp = DataParallel(rank, world, torch.device("cpu"))
        results = [dp_train(model_dir, stage, bs, dp) for stage, bs in CASES]
        results.append(_stop_and_resume(model_dir, dp, f"{out}/ck"))
        torch.save(results, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


class Stop(Exception):
    pass


def _stop_at_2(step, metrics):
    if step == 2:
        raise Stop  # every rank stops here; rank 0 has saved step 1's checkpoint


def _stop_and_resume(model_dir, dp, ck_root):
    """SFT, 5 rows in batches of 2 (3 steps): uninterrupted vs stopped at step 2 + resumed
    -> (uninterrupted weights, resumed weights, the steps the resumed run trained)."""
    whole = dp_train(model_dir, "sft", 2, dp)[1]
    try:
        dp_train(model_dir, "sft", 2, dp, ck_root, _stop_at_2)
    except Stop:
        pass
    steps = []
    resumed = dp_train(model_dir, "sft", 2, dp, ck_root, lambda step, _: steps.append(step))[1]
    return whole, resumed, steps


@pytest.fixture(scope="module")
def two_ranks(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    mp.spawn(_rank, args=(2, free_port(), str(tiny_model_dir), str(out)), nprocs=2)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)], out


def test_two_ranks_resume_to_the_uninterrupted_weights_and_one_process_refuses(
        two_ranks, tiny_model_dir):
    results, out = two_ranks
    for rank in range(2):
        whole, resumed, steps = results[rank][len(CASES)]
        assert steps == [2, 3]  # continued after the checkpoint of step 1
        assert all(torch.equal(whole[k], resumed[k]) for k in whole)
    ck_root = out / "ck"
    assert [p.name for p in ck_root.iterdir()] == ["step_00000001", "step_00000002"]
    with pytest.raises(ValueError, match=r"written by 2 rank\(s\); resume it with "
                                         r"model.nproc=2 \(now 1\)"):
        dp_train(tiny_model_dir, "sft", 2, None, ck_root)


@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"{s}-bs{b}" for s, b in CASES])
def test_two_ranks_make_the_single_process_update(tiny_model_dir, two_ranks, case):
    stage, batch_size = CASES[case]
    ref_metrics, ref_weights = dp_train(tiny_model_dir, stage, batch_size, None)
    results, _ = two_ranks
    metrics, weights = results[0][case]
    init = dp_initial(tiny_model_dir, stage).state_dict()
    assert any(not torch.equal(init[k], ref_weights[k]) for k in ref_weights)  # it trained
    assert metrics.keys() == ref_metrics.keys()
    for key, value in ref_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-5), key
    for key, ref in ref_weights.items():
        torch.testing.assert_close(weights[key], ref, rtol=1e-5, atol=1e-5, msg=key)
        torch.testing.assert_close(results[1][case][1][key], weights[key], rtol=0, atol=0)
