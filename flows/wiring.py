"""Stage wiring shared by the pipeline and the retrain flow (called inside a flow run).

The pipeline is validate -> sft -> [reward_model -> reward_norm -> critic_init -> ppo] ->
evaluate -> register; a retrain starts the bracketed part from the champion instead of a
fresh SFT policy. Both flows call these functions, so the order lives in one place.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tasks.config import PipelineConfig
from tasks.evaluate import evaluate, register
from tasks.finish import fail_parent, finish
from tasks.ppo import ppo
from tasks.prepare import prepare
from tasks.tracking import RunContext, system_metrics
from tasks.train import critic_init, reward_model, reward_norm, sft
from tasks.validate import validate

PrepHook = Callable[[RunContext, dict], dict]


@contextmanager
def tracked(ctx: RunContext, config: PipelineConfig) -> Iterator[None]:
    """System metrics on the parent run while stages run; the parent is marked FAILED when
    a stage raises (the error propagates)."""
    tracking = config.tracking
    try:
        with system_metrics(ctx, tracking.system_metrics, tracking.system_metrics_interval_s):
            yield
    except BaseException:
        fail_parent(ctx)
        raise


def train_policy(ctx: RunContext, config: PipelineConfig, prep: dict, data: dict,
                 start: dict, rm_init_dir: str | None = None,
                 reference_dir: str | None = None) -> dict:
    """reward_model -> reward_norm -> critic_init -> ppo, PPO starting from ``start``
    (``{"model_dir": ...}``: the SFT policy, or the champion in a retrain)."""
    rm_out = reward_model(ctx, config, prep, data, start, init_dir=rm_init_dir)
    norm_out = reward_norm(ctx, config, data, rm_out)
    critic_out = critic_init(ctx, config, rm_out)
    ppo_out = ppo(ctx, config, prep, data, start, rm_out, norm_out, critic_out,
                  reference_dir=reference_dir)
    return {"reward_model": rm_out, "reward_norm": norm_out, "critic_init": critic_out,
            "ppo": ppo_out}


def run_pipeline(config: PipelineConfig, resume_run_id: str | None = None,
                 prep_hook: PrepHook | None = None, lineage: dict | None = None) -> dict:
    """The whole pipeline in the current flow run -> the per-stage summary. ``prep_hook``
    may change the prepared inputs (the retrain flow adds its batches to the data)."""
    prep = prepare(config, resume_run_id)
    ctx = RunContext.model_validate(prep["ctx"])
    if prep_hook is not None:
        prep = prep_hook(ctx, prep)
    with tracked(ctx, config):
        data = validate(ctx, config, prep)
        sft_out = sft(ctx, config, prep, data)
        trained = train_policy(ctx, config, prep, data, sft_out)
        eval_out = evaluate(ctx, config, prep, data, sft_out, trained["reward_model"],
                            trained["ppo"])
        reg_out = register(ctx, config, trained["ppo"], eval_out, trained["reward_model"],
                           data, lineage=lineage)
    outputs = {"validate": data, "sft": sft_out, **trained, "evaluate": eval_out,
               "register": reg_out}
    return finish(ctx, outputs)
