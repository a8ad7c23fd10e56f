"""Ranks on several machines resume only from one checkpoint: when the ranks see different
latest checkpoints (rank 0's node has one, rank 1's has none: no shared filesystem), every
rank stops with what each sees and the fix; when they see the same one, nothing happens."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rlhf_core.parallel.distributed import DataParallel, check_same_checkpoint
from tests.servers import free_port


def _rank(rank: int, port: int, root: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    dp, results = DataParallel(rank, 2, torch.device("cpu")), []
    try:
        for folder in (Path(root) / "shared", Path(root) / ("a" if rank == 0 else "b")):
            try:
                check_same_checkpoint(folder, dp)
                results.append("ok")
            except RuntimeError as err:
                results.append(str(err))
    finally:
        dist.destroy_process_group()
    (Path(root) / f"rank{rank}.txt").write_text("\n".join(results))


def _checkpoint(folder: Path, step: int) -> None:
    path = folder / f"step_{step:08d}"
    path.mkdir(parents=True)
    (path / "meta.json").write_text("{}")


def test_ranks_that_see_different_checkpoints_refuse_to_resume(tmp_path):
    _checkpoint(tmp_path / "shared", 4)
    _checkpoint(tmp_path / "shared", 2)
    _checkpoint(tmp_path / "a", 4)  # rank 0's machine; rank 1's folder "b" has none
    mp.spawn(_rank, args=(free_port(), str(tmp_path)), nprocs=2)
    same0, differ0 = (tmp_path / "rank0.txt").read_text().split("\n", 1)
    same1, differ1 = (tmp_path / "rank1.txt").read_text().split("\n", 1)
    assert same0 == same1 == "ok"
    assert differ0.startswith("rank 0 sees latest checkpoint step 4 in ")
    assert differ1.startswith("rank 1 sees latest checkpoint step -1 in ")
    for err in (differ0, differ1):
        assert "other ranks see steps -1..4" in err
        assert "filesystem every node mounts at the same path" in err
        assert "model.nnodes=1 and model.nproc=2" in err
