"""Stage wiring shared by every flow that trains (called inside a flow run), so the order of
the stages lives in one place.

The pipeline is [validate -> sft -> (reward_model -> reward_norm [-> judge_model])] ->
[(critic_init -> ppo) -> evaluate] -> register, judge_model being the judge of PPO's held-out
checks. A retrain runs the two inner groups (``train_policy``) from the champion; a sweep runs
the first bracket once (``shared_stages``) and the second per point (``rl_stages``).
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tasks.config import PipelineConfig
from tasks.finish import fail_parent, finish
from tasks.prepare import Prepared, prepare
from tasks.results import PipelineResult
from tasks.runtime.prefect_api import rename_flow_run
from tasks.stages.critic_init import critic_init
from tasks.stages.evaluate import evaluate
from tasks.stages.judge_model import judge_model
from tasks.stages.ppo import ppo
from tasks.stages.records import DataRecord, ModelRecord, StageRecord
from tasks.stages.register import register
from tasks.stages.reward_model import reward_model
from tasks.stages.reward_norm import reward_norm
from tasks.stages.sft import sft
from tasks.stages.validate import validate
from tasks.summary import publish_summary
from tasks.tracking.runs import RunContext, system_metrics

PrepHook = Callable[[RunContext, Prepared], Prepared]
DataHook = Callable[[RunContext, DataRecord], DataRecord]  # validate's -> the RM's data


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


Outputs = dict[str, StageRecord]


def reward_stages(ctx: RunContext, config: PipelineConfig, prep: Prepared, data: DataRecord,
                  start: ModelRecord, rm_init_dir: str | None = None,
                  judge: ModelRecord | None = None) -> Outputs:
    """reward_model (from ``start``'s trunk, or warm from ``rm_init_dir``) -> reward_norm,
    and the judge reward model PPO's held-out checks score with (``judge``, a retrain gate's,
    else trained here on the pairs the reward model held out), when they use one."""
    rm_out = reward_model(ctx, config, prep, data, start, init_dir=rm_init_dir)
    out = {"reward_model": rm_out, "reward_norm": reward_norm(ctx, config, data, rm_out)}
    if config.ppo.health.uses_judge:
        out["judge_model"] = judge or judge_model(ctx, config, data, start)
    return out


def policy_stages(ctx: RunContext, config: PipelineConfig, prep: Prepared, data: DataRecord,
                  start: ModelRecord, rewards: Outputs,
                  reference_dir: str | None = None) -> Outputs:
    """critic_init (or its skip) -> ppo from ``start`` against the reward model."""
    rm_out = rewards["reward_model"]
    critic_out = critic_init(ctx, config, rm_out)
    ppo_out = ppo(ctx, config, prep, data, start, rm_out, rewards["reward_norm"], critic_out,
                  judge=rewards.get("judge_model"), reference_dir=reference_dir)
    return {"critic_init": critic_out, "ppo": ppo_out}


def train_policy(ctx: RunContext, config: PipelineConfig, prep: Prepared, data: DataRecord,
                 start: ModelRecord, rm_init_dir: str | None = None,
                 reference_dir: str | None = None, judge: ModelRecord | None = None) -> Outputs:
    """reward_model -> reward_norm [-> judge_model] -> critic_init -> ppo, PPO starting from
    ``start`` (the SFT policy, or the champion in a retrain)."""
    rewards = reward_stages(ctx, config, prep, data, start, rm_init_dir, judge)
    return {**rewards, **policy_stages(ctx, config, prep, data, start, rewards, reference_dir)}


def shared_stages(ctx: RunContext, config: PipelineConfig, prep: Prepared,
                  data_hook: DataHook | None = None) -> Outputs:
    """validate -> sft -> reward_model -> reward_norm: what a sweep computes once.
    ``data_hook`` may change the reward model's data (a retrain's judge split)."""
    data = validate(ctx, config, prep)
    sft_out = sft(ctx, config, prep, data)
    rm_data = data if data_hook is None else data_hook(ctx, data)
    return {"validate": data, "sft": sft_out,
            **reward_stages(ctx, config, prep, rm_data, sft_out)}


def rl_stages(ctx: RunContext, config: PipelineConfig, prep: Prepared,
              shared: Outputs) -> Outputs:
    """critic_init -> ppo -> evaluate on the shared stages' outputs (a sweep point)."""
    data, sft_out = shared["validate"], shared["sft"]
    trained = policy_stages(ctx, config, prep, data, sft_out, shared)
    eval_out = evaluate(ctx, config, prep, data, sft_out, shared["reward_model"],
                        trained["ppo"], judge=shared.get("judge_model"))
    return {**trained, "evaluate": eval_out}


def run_pipeline(config: PipelineConfig, resume_run_id: str | None = None,
                 prep_hook: PrepHook | None = None, lineage: dict | None = None,
                 data_hook: DataHook | None = None,
                 run_name: str | None = None) -> PipelineResult:
    """The whole pipeline in the current flow run -> its result (each stage's record). ``prep_hook``
    may change the prepared inputs (the retrain flow adds its batches to the data);
    ``data_hook`` the reward model's validated data (the retrain's judge split).
    ``run_name``: the flow run's name, given to a new MLflow parent run; a resumed run keeps
    its own, which the flow run then takes (one name in both UIs)."""
    prep = prepare(config, resume_run_id, run_name)
    ctx = prep.ctx
    if run_name and ctx.run_name != run_name:
        rename_flow_run(ctx.run_name)
    if prep_hook is not None:
        prep = prep_hook(ctx, prep)
    with tracked(ctx, config):
        outputs = shared_stages(ctx, config, prep, data_hook)
        outputs.update(rl_stages(ctx, config, prep, outputs))
        outputs["register"] = register(ctx, config, outputs["ppo"], outputs["evaluate"],
                                       outputs["reward_model"], outputs["validate"],
                                       lineage=lineage)
    result = finish(ctx, outputs, config.tracking.keep_resume_state)
    publish_summary(result, result.run_name)
    return result
