"""model.parallel=fsdp (FSDP2 fully_shard per block, then the root) on 2 gloo ranks: one SFT
step and one reward-model step on a global batch of 5 rows (shards of 3 and 2 rows, different
token counts) make the 1-process update (loss, logged metrics, gradient norm and the full
weights gathered into the plain model, within 1e-5). Stopped after a checkpoint (full
weights + full optimizer state written by rank 0) and resumed, 2 fsdp ranks end with the
uninterrupted run's weights; the checkpoint's weights load into a plain model."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_model

from rlhf_core.checkpoint import Checkpointer
from rlhf_core.config import OptimConfig, RewardConfig, SFTConfig
from rlhf_core.distributed import DataParallel
from rlhf_core.loader import LoadSpec, load_policy, load_tokenizer, new_scalar_model
from rlhf_core.reward import train_reward_model
from rlhf_core.sft import train_sft

WORDS = "hello world tell me about cats dogs rain sun please thanks sure nice good bad".split()
CASES = (("sft", 5), ("reward_model", 5))  # one step each; shards of 3 and 2 rows


def _rows(n: int = 5) -> list[dict]:
    rows = []
    for i in range(n):
        resp = " ".join(WORDS[(i + j) % len(WORDS)] for j in range(1 + 2 * i))
        rows.append({"prompt": f"user : tell me about {WORDS[i]} assistant :",
                     "response": resp, "chosen": resp, "rejected": WORDS[-1 - i]})
    return rows


def _train(model_dir, stage: str, batch_size: int, dp, ck_root=None, on_log=None):
    spec, optim = LoadSpec(), OptimConfig(lr=1e-2, warmup_ratio=0.0, schedule="constant")
    tok = load_tokenizer(model_dir, spec)
    torch.manual_seed(0)  # the RM's fresh head
    model = load_policy(model_dir, spec) if stage == "sft" else new_scalar_model(model_dir, spec)
    gen = torch.Generator().manual_seed(0)
    if stage == "sft":
        ck = None if ck_root is None else Checkpointer(ck_root, {"model": model}, every=1)
        cfg = SFTConfig(batch_size=batch_size, epochs=1, optim=optim, log_every=1)
        last = train_sft(model, tok, _rows(), cfg, torch.device("cpu"), gen, on_log,
                         progress=False, checkpointer=ck, dp=dp)
    else:
        cfg = RewardConfig(batch_size=batch_size, epochs=1, optim=optim)
        last = train_reward_model(model, tok, _rows(), cfg, torch.device("cpu"), gen,
                                  progress=False, dp=dp)
    return last, {k: v.detach().clone() for k, v in model.state_dict().items()}


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
        results = [_train(model_dir, stage, bs, dp) for stage, bs in CASES]
        whole = _train(model_dir, "sft", 2, dp)[1]
        try:
            _train(model_dir, "sft", 2, dp, f"{out}/ck", _stop_at_2)
        except Stop:
            pass
        steps = []
        resumed = _train(model_dir, "sft", 2, dp, f"{out}/ck",
                         lambda step, _: steps.append(step))[1]
        results.append((whole, resumed, steps))
        torch.save(results, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_fsdp_ranks(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp")
    mp.spawn(_rank, args=(2, _free_port(), str(tiny_model_dir), str(out)), nprocs=2)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)], out


@pytest.mark.parametrize("case", range(len(CASES)), ids=[s for s, _ in CASES])
def test_two_fsdp_ranks_make_the_single_process_update(tiny_model_dir, two_fsdp_ranks, case):
    stage, batch_size = CASES[case]
    ref_metrics, ref_weights = _train(tiny_model_dir, stage, batch_size, None)
    results, _ = two_fsdp_ranks
    metrics, weights = results[0][case]
    assert metrics.keys() == ref_metrics.keys()
    for key, value in ref_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-5), key
    assert weights.keys() == ref_weights.keys()
    for key, ref in ref_weights.items():
        torch.testing.assert_close(weights[key], ref, rtol=1e-5, atol=1e-5, msg=key)
    torch.manual_seed(0)
    init = (load_policy(tiny_model_dir, LoadSpec()) if stage == "sft"
            else new_scalar_model(tiny_model_dir, LoadSpec())).state_dict()
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
    plain = load_policy(tiny_model_dir, LoadSpec())
    load_model(plain, str(saved))  # strict: every weight of the plain model is in the file
    assert not torch.equal(plain.transformer.wte.weight,
                           load_policy(tiny_model_dir, LoadSpec()).transformer.wte.weight)
    state = torch.load(out / "ck" / "step_00000002" / "state.pt", weights_only=True)
    assert state["optimizer"]["state"]  # the full optimizer state, written once
