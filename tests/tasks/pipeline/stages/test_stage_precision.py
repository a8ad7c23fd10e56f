"""The SFT and reward-model stages score their held-out figures in the precision they trained
in (bf16 autocast here), not in their fp32 master weights' precision."""

from __future__ import annotations

import torch

from tasks.config.pipeline_config import load_config
from tasks.pipeline.stages import reward_model as rm_stage
from tasks.pipeline.stages import sft as sft_stage
from tests.fake_stage import FakeStageContext
from tests.shared import every_stage, prepared_for, write_config


def _spy(module, name: str, seen: dict, monkeypatch):
    real = getattr(module, name)

    def spy(*args, **kwargs):
        seen[name] = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") \
            else None
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)


def test_sft_and_reward_model_evaluate_in_their_training_precision(tmp_path, tiny_model_dir,
                                                                    monkeypatch):
    seen: dict = {}
    _spy(sft_stage, "sft_eval_loss", seen, monkeypatch)
    _spy(rm_stage, "evaluate_reward_model", seen, monkeypatch)
    _spy(rm_stage, "gold_accuracy", seen, monkeypatch)
    cfg = load_config(write_config(tmp_path, tiny_model_dir), ["model.precision=bf16"])
    prep = prepared_for(cfg, tmp_path / "work", cfg.data, tiny_model_dir)
    stages = every_stage()

    def run(name, **inputs):
        return stages[name].body(FakeStageContext(cfg, name, tmp_path / "work", seed=cfg.seed),
                                 **inputs)

    data = run("validate", prep=prep)
    sft = run("sft", prep=prep, data=data)
    rm = run("reward_model", prep=prep, data=data, start=sft)
    assert seen == dict.fromkeys(("sft_eval_loss", "evaluate_reward_model", "gold_accuracy"),
                                 torch.bfloat16)
    assert 0.0 <= rm.metrics["eval/rm_accuracy"] <= 1.0
    assert sft.metrics["sft/response_loss_train"] > 0
