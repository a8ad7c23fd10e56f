"""Entry point of one data-parallel rank, ``torchrun ... -m tasks.pipeline.stages.rank_main
SPEC``: the same stage body as the in-process path, with its :class:`DataParallel`. Rank 0
writes the output to SPEC's ``output``; a failing rank writes ``error_rank<r>.json`` for the
task to re-raise and exits non-zero so torchrun stops the others."""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

from rlhf_core.parallel.distributed import check_same_checkpoint, init_from_env, shutdown
from tasks.config.pipeline_config import PipelineConfig
from tasks.pipeline.prepare import setup_models, setup_torch
from tasks.pipeline.stages.context import StageContext, checkpoint_dir
from tasks.pipeline.stages.run import typed_inputs
from tasks.pipeline.stages.table import STAGES
from tasks.platform.files import write_json
from tasks.platform.mlflow.runs import RunContext, hardware_tags, set_tags


def run(spec: dict) -> None:
    cfg = PipelineConfig.model_validate(spec["cfg"])
    ctx = RunContext.model_validate(spec["ctx"])
    device, _ = setup_models(cfg.model)
    dp = init_from_env(device, cfg.model.parallel)
    if dp is None:
        raise RuntimeError("tasks.pipeline.stages.rank_main runs under torchrun (WORLD_SIZE > 1)")
    if cfg.model.torch_threads and dp.device.type == "cpu":
        # model.torch_threads is the stage's CPU budget on each machine: split across its ranks
        local = int(os.environ.get("LOCAL_WORLD_SIZE", dp.world))
        threads = max(1, cfg.model.torch_threads // local)
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(
            update={"torch_threads": threads})})
    try:
        if dp.is_main:  # the ranks' threads (and a routed stage's machine) on the child run
            setup_torch(cfg.model)
            set_tags(ctx.client(), spec["run_id"], hardware_tags(dp.device))
        check_same_checkpoint(checkpoint_dir(ctx, spec["stage"]), dp)
        stage = STAGES[spec["stage"]]
        out = stage.body(StageContext(ctx, cfg, stage, spec["run_id"], dp),
                         **typed_inputs(stage, spec["inputs"]))
        if dp.is_main:
            write_json(spec["output"], out.model_dump(mode="json"))
    finally:
        shutdown()


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    try:
        run(spec)
    except Exception as err:
        rank = os.environ.get("RANK", "?")
        write_json(Path(spec["errors"]) / f"error_rank{rank}.json",
                   {"rank": rank, "type": type(err).__name__, "message": str(err),
                    "traceback": traceback.format_exc()})
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
