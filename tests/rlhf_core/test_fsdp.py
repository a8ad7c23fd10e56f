"""model.parallel=fsdp (FSDP2 fully_shard per block, then the root) on 2 gloo ranks: one SFT
step and one reward-model step on a global batch of 5 rows (shards of 3 and 2 rows, different
token counts) make the 1-process update (loss, logged metrics, gradient norm and the full
weights gathered into the plain model, within 1e-5). Stopped after a checkpoint (full
weights + full optimizer state written by rank 0) and resumed, 2 fsdp ranks end with the
uninterrupted run's weights; the checkpoint's weights load into a plain model."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_model

from rlhf_core.parallel.distributed import DataParallel
from tests.servers import free_port
from tests.shared import dp_initial, dp_train

CASES = (("sft", 5), ("reward_model", 5))  # one step each; shards of 3 and 2 rows


class Stop(Exception):
    pass


def _stop_at_2(step, metrics):
    if step == 2:
        raise Stop  # rank 0 has saved step 1's checkpoint


def _rank(rank: int, world: int, port: int, model_dir: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    torch.set_num_threads(1)
    try:
        dp = DataParallel(rank, world, torch.device("cpu"), parallel="fsdp")
        results = [dp_train(model_dir, stage, bs, dp) for stage, bs in CASES]
        whole = dp_train(model_dir, "sft", 2, dp)[1]
        try:
            dp_train(model_dir, "sft", 2, dp, f"{out}/ck", _stop_at_2)
        except Stop:
            pass
        steps = []
        resumed = dp_train(model_dir, "sft", 2, dp, f"{out}/ck",
                         lambda step, _: steps.append(step))[1]
        results.append((whole, resumed, steps))
        torch.save(results, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_fsdp_ranks(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp")
    mp.spawn(_rank, args=(2, free_port(), str(tiny_model_dir), str(out)), nprocs=2)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)], out


@pytest.mark.parametrize("case", range(len(CASES)), ids=[s for s, _ in CASES])
def test_two_fsdp_ranks_make_the_single_process_update(tiny_model_dir, two_fsdp_ranks, case):
    stage, batch_size = CASES[case]
    ref_metrics, ref_weights = dp_train(tiny_model_dir, stage, batch_size, None)
    results, _ = two_fsdp_ranks
    metrics, weights = results[0][case]
    assert metrics.keys() == ref_metrics.keys()
    for key, value in ref_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-5), key
    assert weights.keys() == ref_weights.keys()
    for key, ref in ref_weights.items():
        torch.testing.assert_close(weights[key], ref, rtol=1e-5, atol=1e-5, msg=key)
    init = dp_initial(tiny_model_dir, stage).state_dict()
    assert any(not torch.equal(init[k], weights[k]) for k in weights)  # it trained


def test_fsdp_resumes_to_the_uninterrupted_weights_from_a_plain_format_checkpoint(
        two_fsdp_ranks, tiny_model_dir):
    results, out = two_fsdp_ranks
    for rank in range(2):
        assert results[rank][len(CASES)][2] == [2, 3]  # continued after step 1's checkpoint
    whole, resumed, _ = results[0][len(CASES)]  # rank 0 holds the gathered weights
    for key in whole:
        torch.testing.assert_close(resumed[key], whole[key], rtol=1e-6, atol=1e-6, msg=key)
    saved = out / "ck" / "step_00000002" / "model.safetensors"
    plain = dp_initial(tiny_model_dir, "sft")
    load_model(plain, str(saved))  # strict: every weight of the plain model is in the file
    assert not torch.equal(plain.transformer.wte.weight,
                           dp_initial(tiny_model_dir, "sft").transformer.wte.weight)
    state = torch.load(out / "ck" / "step_00000002" / "state.pt", weights_only=True)
    assert state["optimizer"]["state"]  # the full optimizer state, written once
