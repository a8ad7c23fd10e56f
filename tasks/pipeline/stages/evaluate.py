"""evaluate: sample the SFT and the PPO policy on held-out prompts and compare them (RM score,
KL, gold-judge win rate where there is a judge); measure the alignment tax; and compare the
policy with its start by a scorer it was not trained against, which register reads before it
makes a first champion."""

from __future__ import annotations

import pandas as pd

from rlhf_core.eval.evaluate import against_start, compare_policies, sample_policy
from rlhf_core.eval.serving import score_rows
from rlhf_core.faults import pause_point
from rlhf_core.models.loader import load_pretrained, load_tokenizer
from rlhf_core.models.models import resize_for_tokenizer
from tasks.pipeline.judge import resolve_judge
from tasks.pipeline.prepare import Prepared
from tasks.pipeline.rule import eval_scorer
from tasks.pipeline.stages.context import Stage, StageContext
from tasks.pipeline.stages.health import held_out_prompts
from tasks.pipeline.stages.progress import StageProgress
from tasks.pipeline.stages.records import DataRecord, EvalRecord, ModelRecord, PolicyRecord
from tasks.pipeline.stages.run import stage_task
from tasks.pipeline.stages.tax import applies, base_cache, measure, summary_line, tax_inputs
from tasks.platform.mlflow.models import load_pyfunc, pyfunc_scores
from tasks.platform.mlflow.tags import EVAL_SCORER_TAG, EVAL_START_SCORER_TAG
from tasks.platform.prefect.prefect_api import in_prefect_run


def start_scores(sc: StageContext, judge: ModelRecord | None, tokenizer, prompts: list[str],
                 samples: dict[str, dict], rows: list[dict]) -> tuple[str, dict] | None:
    """(label, per-policy scores) by a scorer independent of the reward model: the gold
    judge, else ``ppo.health.scorer``, else the judge model; None: none."""
    if rows and "sft_judge_score" in rows[0]:
        return "the gold judge", {"sft": [r["sft_judge_score"] for r in rows],
                                  "policy": [r["policy_judge_score"] for r in rows]}
    uri = sc.cfg.ppo.health.external_scorer
    if uri is not None:
        model = load_pyfunc(uri, sc.run.tracking_uri)
        return uri, {k: pyfunc_scores(model, prompts, list(v["response"]))
                     for k, v in samples.items()}
    if judge is None or judge.model is None:
        return None
    model = load_pretrained(sc.local(judge.model, "judge_model's model"), sc.spec, "scalar",
                            trainable=False).to(sc.device)
    return (f"the judge reward model (judge_model run {judge.run_id})",
            {k: score_rows(model, tokenizer, prompts, list(v["response"]))
             for k, v in samples.items()})


def body(sc: StageContext, prep: Prepared, data: DataRecord, sft: ModelRecord, rm: ModelRecord,
         policy: PolicyRecord, judge: ModelRecord | None = None) -> EvalRecord:
    """``judge``: the judge reward model, last resort for the start comparison."""
    device, spec = sc.device, sc.spec
    sc.seeded()
    tokenizer = load_tokenizer(sc.local(data.tokenizer, "validate's tokenizer"), spec)
    ref = load_pretrained(sc.local(sft.model, "sft's model"), spec, trainable=False).to(device)
    trained = load_pretrained(sc.local(policy.policy, "ppo's policy"), spec,
                              trainable=False).to(device)
    rm_model = load_pretrained(sc.local(rm.model, "reward_model's model"), spec, "scalar",
                               trainable=False).to(device)
    e = sc.cfg.eval
    prompts = held_out_prompts(sc.local(data.data, "validate's data"), e.num_prompts)[0]
    probe, text = tax_inputs(e.tax) if applies(sc.cfg) else ([], [])
    # progress in answered prompts: both policies', then the probe's (three models)
    live = StageProgress(sc.stage.name, 2 * len(prompts) + 3 * len(probe), bar=sc.progress)
    live(0)
    # common random numbers: the paired comparison sees only what PPO changed
    sc.seeded()
    sft_samples = sample_policy(ref, None, rm_model, tokenizer, prompts, e.sampling,
                                device=device, precision=spec.precision, on_batch=live)
    sc.seeded()
    pol_samples = sample_policy(trained, ref, rm_model, tokenizer, prompts, e.sampling,
                                device=device, precision=spec.precision,
                                on_batch=lambda n: live(len(prompts) + n))
    metrics, rows = compare_policies(sft_samples, pol_samples, prompts, resolve_judge(prep.judge))
    independent = start_scores(sc, judge, tokenizer, prompts,
                               {"sft": sft_samples, "policy": pol_samples}, rows)
    if independent is not None:
        metrics.update(against_start(independent[1]["sft"], independent[1]["policy"]))
    if probe:
        base = load_pretrained(prep.base_model, spec, trainable=False).to(device)
        resize_for_tokenizer(base, tokenizer)  # the data gate's PAD, if it added one
        tax, tax_rows = measure(e.tax, probe, text, {"base": base, "sft": ref, "policy": trained},
                                tokenizer, lambda n: live(2 * len(prompts) + n),
                                base_cache(prep, spec, device))
        metrics.update(tax)
        sc.log_table(pd.DataFrame(tax_rows), "eval/tax_probe.json")
    pause_point("evaluate:scored")
    scorer = eval_scorer(prep.judge, rm.run_id, prompts)
    sc.set_tags({EVAL_SCORER_TAG: scorer, EVAL_START_SCORER_TAG:
                 independent[0] if independent else "none"}, parent=True)
    sc.log(0, metrics)
    sc.log_parent(metrics)
    sc.log_table(pd.DataFrame(rows), "eval/side_by_side.json")
    if in_prefect_run():
        from prefect.artifacts import create_table_artifact

        create_table_artifact(key="rlhf-eval-samples", table=rows[: e.num_side_by_side],
                              description="SFT vs PPO, side by side")
    first = ("eval/judge_win_rate", "eval/judge_score_policy", "eval/judge_score_sft",
             "eval/kl_to_ref", "eval/eos_rate_policy")
    ordered = {k: metrics[k] for k in first if k in metrics}
    return EvalRecord(metrics={**ordered, **metrics}, scorer=scorer, tax=summary_line(
        metrics, e.tax.budget), start_scorer=independent[0] if independent else None)


# on this run and the parent run; the judge's figures where a gold judge exists
STAGE = Stage("evaluate", body, EvalRecord, sections=("eval",), seed_offset=3,
              metrics=("eval/rm_score_sft", "eval/rm_score_policy", "eval/kl_to_ref",
                       "eval/eos_rate_sft", "eval/eos_rate_policy", "eval/length_sft",
                       "eval/length_policy", "eval/num_prompts", "eval/judge_score_sft",
                       "eval/judge_score_policy", "eval/judge_win_rate", "eval/rm_gain_z",
                       "eval/judge_gain_z", "eval/rm_judge_gap_z", "eval/rm_judge_correlation",
                       "eval/vs_start_diff", "eval/vs_start_diff_low", "eval/vs_start_diff_high",
                       "eval/vs_start_win_rate", "eval/vs_start_win_low", "eval/vs_start_win_high",
                       "eval/tax/probe_acc_*", "eval/tax/probe_diff_*_*", "eval/tax/bpb_*"),
              artifacts=("eval/side_by_side.json", "eval/tax_probe.json"))
evaluate = stage_task(STAGE)
