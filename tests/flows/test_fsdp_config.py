"""model.parallel: ddp by default; fsdp with several ranks is refused before any stage runs
(PPO does not run under FSDP yet), naming the setting; a bad value names the field."""

import pytest
import torch

from flows.cli import main


def test_fsdp_on_several_ranks_is_refused_before_any_stage_naming_the_setting(capsys,
                                                                               tmp_path):
    workdir = f"tracking.workdir={tmp_path}/runs"
    assert main(["run", "--nproc", "2", "--set", "model.parallel=fsdp", "--set", workdir]) == 2
    err = capsys.readouterr().err
    assert "model.parallel=fsdp" in err and "model.parallel=ddp" in err
    assert not (tmp_path / "runs").exists()  # refused before anything was written
    assert main(["run", "--set", "model.parallel=zero3"]) == 2
    assert "model.parallel" in capsys.readouterr().err


def test_ppo_ranks_refuse_fsdp_naming_the_setting():
    from rlhf_core.distributed import DataParallel
    from rlhf_core.ppo_dist import make_trainer

    dp = DataParallel(0, 2, torch.device("cpu"), parallel="fsdp")
    with pytest.raises(ValueError, match="model.parallel=fsdp: PPO runs under ddp only"):
        make_trainer(None, None, None, None, None, None, None, dp=dp)
