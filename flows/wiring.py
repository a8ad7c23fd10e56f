"""Stage wiring shared by every flow that trains (called inside a flow run), so the order of the
stages lives in one place: :func:`run_pipeline` runs the pipeline and a retrain round through it
(a challenge trains from the champion and is gated against it); a sweep runs ``shared_stages``
once, then ``rl_stages`` per point."""

from collections.abc import Iterator
from contextlib import contextmanager

from tasks.config.pipeline_config import PipelineConfig
from tasks.pipeline.finish import fail_parent, finish
from tasks.pipeline.prepare import Prepared, prepare
from tasks.pipeline.results import PipelineResult, publish_summary
from tasks.pipeline.stages.critic_init import critic_init
from tasks.pipeline.stages.evaluate import evaluate
from tasks.pipeline.stages.judge_model import judge_model, judge_split
from tasks.pipeline.stages.ppo import ppo
from tasks.pipeline.stages.records import Artifact, DataRecord, ModelRecord, StageRecord
from tasks.pipeline.stages.register import register
from tasks.pipeline.stages.reward_model import reward_model
from tasks.pipeline.stages.reward_norm import reward_norm
from tasks.pipeline.stages.sft import sft
from tasks.pipeline.stages.validate import validate
from tasks.platform.mlflow.runs import RunContext, system_metrics
from tasks.platform.prefect.prefect_api import rename_flow_run
from tasks.retrain.approval.waiting import held_for_approval, hold_candidate
from tasks.retrain.batches import add_batches, mark_consumed
from tasks.retrain.gate.champion import Champion, fetch_champion
from tasks.retrain.gate.stage import batch_pair_keys, gate, resolve_scorer
from tasks.retrain.records import Round
from tasks.retrain.round import lineage_tags, named_batch_rows, round_start


@contextmanager
def failing(ctx: RunContext) -> Iterator[None]:
    """The parent run is marked FAILED when a stage raises (the error propagates)."""
    try:
        yield
    except BaseException:
        fail_parent(ctx)
        raise


@contextmanager
def tracked(ctx: RunContext, config: PipelineConfig) -> Iterator[None]:
    """:func:`failing`, with system metrics on the parent run while stages run."""
    t = config.tracking
    with failing(ctx), system_metrics(ctx, t.system_metrics, t.system_metrics_interval_s):
        yield


Outputs = dict[str, StageRecord]


def reward_stages(ctx: RunContext, config: PipelineConfig, prep: Prepared, data: DataRecord,
                  start: ModelRecord, rm_init_dir: str | None = None,
                  judge: ModelRecord | None = None) -> Outputs:
    """reward_model (from ``start``'s trunk, or warm from ``rm_init_dir``) -> reward_norm, and
    the judge of PPO's held-out checks when they use one (``judge``, else trained here)."""
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
    critic_out = critic_init(ctx, config, rm_out, start)
    ppo_out = ppo(ctx, config, prep, data, start, rm_out, rewards["reward_norm"], critic_out,
                  judge=rewards.get("judge_model"), reference_dir=reference_dir)
    return {"critic_init": critic_out, "ppo": ppo_out}


def shared_stages(ctx: RunContext, config: PipelineConfig, prep: Prepared,
                  split: bool = False) -> Outputs:
    """validate -> sft -> reward stages: what a sweep computes once. ``split``: the judge's
    pairs are kept from the reward model (a retrain bootstrap with the judge_model scorer)."""
    with named_batch_rows(prep.batch_rows):
        data = validate(ctx, config, prep)
    sft_out = sft(ctx, config, prep, data)
    rm_data = judge_split(ctx, config, data) if split else data
    return {"validate": data, "sft": sft_out, **reward_stages(ctx, config, prep, rm_data, sft_out)}


def rl_stages(ctx: RunContext, config: PipelineConfig, prep: Prepared, shared: Outputs) -> Outputs:
    """critic_init -> ppo -> evaluate on the shared stages' outputs (a sweep point)."""
    data, sft_out = shared["validate"], shared["sft"]
    trained = policy_stages(ctx, config, prep, data, sft_out, shared)
    eval_out = evaluate(ctx, config, prep, data, sft_out, shared["reward_model"],
                        trained["ppo"], judge=shared.get("judge_model"))
    return {**trained, "evaluate": eval_out}


def challenger_stages(ctx: RunContext, config: PipelineConfig, prep: Prepared,
                      champion: Champion, split: bool) -> Outputs:
    """A retrain's challenge: validate -> [judge split -> judge_model] -> reward and policy
    stages from the champion (``retrain.policy_init``, ``retrain.reference``) -> gate."""
    with named_batch_rows(prep.batch_rows):
        data = validate(ctx, config, prep)
    policy_dir, reference_dir, rm_init_dir = round_start(config, champion)
    rm_data, judge = data, None
    if split:
        rm_data = judge_split(ctx, config, data, batch_pair_keys(prep))
        judge = judge_model(ctx, config, rm_data,
                            ModelRecord(model=Artifact(path=champion.sft_dir)))
    start = ModelRecord(model=Artifact(path=policy_dir))
    rewards = reward_stages(ctx, config, prep, rm_data, start, rm_init_dir, judge)
    trained = policy_stages(ctx, config, prep, rm_data, start, rewards, reference_dir)
    gate_out = gate(ctx, config, prep, data, champion, trained["ppo"], rewards["reward_model"],
                    reference_dir, judge)
    return {"validate": data, **rewards, **trained, "gate": gate_out}


def run_pipeline(config: PipelineConfig, resume_run_id: str | None = None,
                 run_name: str | None = None, retrain: Round | None = None) -> PipelineResult:
    """The whole pipeline, then register, in the current flow run -> its result. A resumed
    MLflow run keeps its name, which the flow run takes; ``retrain``: a round's batches join
    the data, a challenge runs :func:`challenger_stages`, a control round registers nothing."""
    prep = prepare(config, resume_run_id, run_name)
    ctx = prep.ctx
    if run_name and ctx.run_name != run_name:
        rename_flow_run(ctx.run_name)
    with tracked(ctx, config):
        champion = fetch_champion(ctx, config) if retrain is not None and retrain.challenge \
            else None
        if retrain is not None:
            prep = add_batches(ctx, config, prep, retrain.batches, champion, retrain.consumed)
        split = retrain is not None and resolve_scorer(config, prep.judge) == "judge_model"
        decision = None
        if champion is None:
            out = shared_stages(ctx, config, prep, split)
            out.update(rl_stages(ctx, config, prep, out))
        else:
            out = challenger_stages(ctx, config, prep, champion, split)
            decision = held_for_approval(config, out["gate"].decision)
        if retrain is None or not retrain.control:
            lineage = None if retrain is None else lineage_tags(
                prep, retrain.batches, champion, decision.scorer if decision else None)
            out["register"] = register(ctx, config, out["ppo"], out.get("gate") or out["evaluate"],
                                       out["reward_model"], out["validate"], lineage=lineage,
                                       decision=decision)
            hold_candidate(ctx, config, out["register"])
            if retrain is not None:
                mark_consumed(ctx, retrain.batches)
    result = finish(ctx, out, config.tracking.keep_resume_state)
    if retrain is None:
        publish_summary(result, result.run_name)  # a round's flow publishes its outcome
    return result
