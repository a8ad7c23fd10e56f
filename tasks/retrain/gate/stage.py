"""The gate stage: both policies sampled and scored alike, the paired test's decision after the tax
veto, recorded as MLflow tags and a Prefect artifact beside the gold judge's where one exists."""

from __future__ import annotations

from dataclasses import fields

import pandas as pd

from rlhf_core.eval.evaluate import sample_policy
from rlhf_core.eval.gate import GateRule, GateSide, gate_decision, pair_key
from rlhf_core.eval.serving import score_rows
from rlhf_core.eval.tax import tax_lost
from rlhf_core.models.loader import load_pretrained, load_tokenizer
from rlhf_core.models.models import resize_for_tokenizer
from rlhf_core.models.sources import resolve_model_source
from rlhf_core.train.optim import seed_everything
from tasks.config.pipeline_config import PipelineConfig
from tasks.config.sections import GateConfig
from tasks.pipeline.judge import resolve_judge
from tasks.pipeline.prepare import Prepared
from tasks.pipeline.rule import Decision, tax_veto
from tasks.pipeline.stages.context import Stage, StageContext
from tasks.pipeline.stages.records import DataRecord, ModelRecord, PolicyRecord
from tasks.pipeline.stages.run import stage_task
from tasks.pipeline.stages.tax import (
    applies,
    base_cache,
    measure,
    over_budget,
    summary_line,
    tax_inputs,
)
from tasks.platform.files import read_jsonl
from tasks.platform.mlflow.models import load_pyfunc, pyfunc_scores
from tasks.platform.mlflow.runs import RunContext, run_url
from tasks.platform.mlflow.tags import (
    COMPARE_PREFIX,
    COMPARE_RESULT_TAG,
    COMPARE_VERSIONS_TAG,
    GATE_DECISION_TAG,
    GATE_GOLD_AGREES_TAG,
    GATE_GOLD_DECISION_TAG,
    GATE_GOLD_PREFIX,
    GATE_PREFIX,
    GATE_REASON_TAG,
    GATE_SCORER_ID_TAG,
    GATE_SCORER_TAG,
)
from tasks.platform.prefect.prefect_api import report
from tasks.retrain.gate.champion import Champion
from tasks.retrain.gate.prompts import GateError
from tasks.retrain.records import GateRecord

SIDE_BY_SIDE = "gate/side_by_side.json"  # the gate run's table: each prompt, both answers
TAX_PROBE = "eval/tax_probe.json"  # the probe's questions, the base's and challenger's answers


def resolve_scorer(cfg: PipelineConfig, judge_name: str) -> str:
    """``retrain.gate.scorer`` -> a built-in scorer or a ``models:/`` URI (``auto``: the gold
    judge if any, else ``judge_model``: a scorer the challenger was not optimised against)."""
    wanted = cfg.retrain.gate.scorer
    if wanted != "auto":
        return wanted
    return "judge" if judge_name != "none" else "judge_model"


def scorer_label(scorer: str) -> str:
    """How the decision names its scorer."""
    return {"judge": "gold judge", "judge_model": "held-out judge reward model",
            "reward_model": "new reward model"}.get(scorer, f"external scorer {scorer}")


def batch_pair_keys(prep: Prepared) -> list[str]:
    """The ``pair_key``s of the pairs the retrain's batches brought."""
    if not prep.batch_rows:
        return []
    combined = read_jsonl(prep.data.preference.path)
    return sorted({pair_key(r) for span in prep.batch_rows
                   for r in combined[span["first"] - 1:span["last"]]})


def challenger_tax(sc, prep, tokenizer, policy) -> tuple[dict, list[dict]]:
    """``policy``'s alignment tax, measured as evaluate measures it, against
    ``model.base_model`` (not the prepared base, which is the champion) -> ``eval/tax/*``
    metrics and the probe's rows."""
    tax = sc.cfg.eval.tax
    probe, text = tax_inputs(tax)
    base_dir = resolve_model_source(sc.cfg.model.base_model)
    base = load_pretrained(base_dir, sc.spec, trainable=False).to(sc.device)
    resize_for_tokenizer(base, tokenizer)  # the data gate's PAD, if it added one
    kept = base_cache(prep.model_copy(update={"base_model": base_dir}), sc.spec, sc.device)
    return measure(tax, probe, text, {"base": base, "policy": policy}, tokenizer, base_cache=kept)


def taxed(decision: dict, tax: dict, cfg) -> dict:
    """The gate's decision after the tax veto (a challenger over ``eval.tax.budget`` does not
    win, however it scores on the task), its figures gaining ``tax_lost``."""
    lost = tax_lost(tax)
    if lost is None:
        return decision
    ruled = tax_veto(Decision(promote=decision["promote"], reason=decision["reason"]),
                     over_budget(tax, cfg.eval.tax.budget), cfg.tracking.promote_flagged)
    return {**decision, "promote": ruled.promote, "reason": ruled.reason,
            "figures": {**decision["figures"], "tax_lost": lost}}


def _scores(sc: StageContext, scorer: str, samples: dict, prompts: list[str], gold,
            judge: ModelRecord | None, tokenizer) -> dict[str, list[float]]:
    """Both sides' per-prompt scores by ``scorer`` -> {"champion": [...], "challenger": [...]}."""
    sides = ("champion", "challenger")
    if scorer == "reward_model":
        return {s: list(samples[s]["score"]) for s in sides}
    if scorer == "judge":
        return {s: [gold(p, r, bool(e)) for p, r, e in zip(
            prompts, samples[s]["response"], samples[s]["has_eos"])] for s in sides}
    if scorer == "judge_model":
        if judge is None:
            raise GateError("retrain.gate.scorer judge_model: no judge reward model trained")
        model = load_pretrained(sc.local(judge.model, "judge_model's model"), sc.spec, "scalar",
                                trainable=False).to(sc.device)
        return {s: score_rows(model, tokenizer, prompts, samples[s]["response"]) for s in sides}
    model = load_pyfunc(scorer, sc.run.tracking_uri)
    return {s: pyfunc_scores(model, prompts, samples[s]["response"]) for s in sides}


def gate_rule(g: GateConfig) -> GateRule:
    """The decision rule's settings from ``retrain.gate``."""
    return GateRule(**g.model_dump(include={f.name for f in fields(GateRule)}))


def _decide(scores: dict, samples: dict, g: GateConfig, seed: int) -> dict:
    champion, challenger = (GateSide(scores[s], samples[s]["has_eos"], samples[s]["kl"])
                            for s in ("champion", "challenger"))
    return gate_decision(champion, challenger, gate_rule(g), seed=seed)


def _gold_tags(decision: dict, gold_decision: dict) -> dict:
    """What the gold judge would have decided (agreement of the scorer with it)."""
    f = gold_decision["figures"]
    tags = {GATE_GOLD_DECISION_TAG: "promote" if gold_decision["promote"] else "keep",
            GATE_GOLD_AGREES_TAG: str(gold_decision["promote"] == decision["promote"])}
    tags.update({GATE_GOLD_PREFIX + k: f"{f[k]:.6g}" for k in ("diff_mean", "ci_low", "ci_high")
                 if k in f})
    return tags


def decision_markdown(ctx: RunContext, run_id: str, decision: dict, scorer: str,
                      champion_version: str, gold_tags: dict, tax: str) -> str:
    f = decision["figures"]
    verdict = "PROMOTE challenger" if decision["promote"] else f"KEEP champion v{champion_version}"
    rows = "\n".join(f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |"
                     for k, v in f.items())
    gold = ""
    if gold_tags:
        diff, low, high = (gold_tags.get(GATE_GOLD_PREFIX + k, "n/a")
                           for k in ("diff_mean", "ci_low", "ci_high"))
        gold = (f"The gold judge would have decided: {gold_tags[GATE_GOLD_DECISION_TAG]} (mean "
                f"diff {diff}, CI [{low}, {high}]).\n\n")
    return (f"# Retrain decision: {verdict}\n\n{decision['reason']}\n\nScorer: {scorer} (the "
            f"same for both policies). Champion: v{champion_version}.\n\n| figure | value |\n"
            f"|---|---|\n{rows}\n\n{gold}"
            f"{tax + chr(10) * 2 if tax else ''}MLflow: {run_url(ctx, run_id)}\n")


def compare_tags(tags: dict[str, str], better: bool, compared: str) -> dict[str, str]:
    """`rlhf compare`'s tags: the gate's under ``rlhf.compare.``, verdict better/not better."""
    verdicts = {"promote": "better", "keep": "not better"}
    out = {COMPARE_PREFIX + k.removeprefix(GATE_PREFIX):
           verdicts.get(v, v) if k == GATE_GOLD_DECISION_TAG else v
           for k, v in tags.items() if k != GATE_DECISION_TAG}
    return {**out, COMPARE_RESULT_TAG: "better" if better else "not better",
            COMPARE_VERSIONS_TAG: compared}


def side_by_side(prompts: list[str], samples: dict, scores: dict) -> pd.DataFrame:
    """Per held-out prompt: both answers and their scores (the approval form shows a few)."""
    return pd.DataFrame({"prompt": prompts,
                         "champion": list(samples["champion"]["response"]),
                         "challenger": list(samples["challenger"]["response"]),
                         "score_champion": scores["champion"],
                         "score_challenger": scores["challenger"]})


def body(sc: StageContext, prep: Prepared, data: DataRecord, champion: Champion,
         policy: PolicyRecord, rm: ModelRecord, reference_dir: str,
         judge: ModelRecord | None = None, compared: str | None = None) -> GateRecord:
    """``judge``: the judge reward model (scorer ``judge_model``). ``compared``: `rlhf
    compare`'s label ("v2 against v1"), recording ``compare/*`` and deciding nothing."""
    g, e = sc.cfg.retrain.gate, sc.cfg.eval
    device, spec = sc.device, sc.spec
    tokenizer = load_tokenizer(sc.local(data.tokenizer, "validate's tokenizer"), spec)
    prompts = [r["prompt"] for r in read_jsonl(
        sc.local(data.data, "validate's data") / "eval_prompts.jsonl")][: g.num_prompts]
    reference = load_pretrained(reference_dir, spec, trainable=False).to(device)
    rm_model = load_pretrained(sc.local(rm.model, "reward_model's model"), spec, "scalar",
                               trainable=False).to(device)
    samples = {}
    for side, path in (("champion", champion.policy_dir),
                       ("challenger", sc.local(policy.policy, "ppo's policy"))):
        seed_everything(sc.seed)  # same sampling noise for both sides
        model = load_pretrained(path, spec, trainable=False).to(device)
        samples[side] = sample_policy(model, reference, rm_model, tokenizer, prompts,
                                      e.sampling, device=device, precision=spec.precision)
    tax, tax_rows = challenger_tax(sc, prep, tokenizer, model) \
        if compared is None and applies(sc.cfg) else ({}, [])  # model: the challenger
    scorer, gold = resolve_scorer(sc.cfg, prep.judge), resolve_judge(prep.judge)
    if scorer == "judge" and gold is None:
        raise GateError("retrain.gate.scorer is 'judge' but the data has no gold judge")
    scores = _scores(sc, scorer, samples, prompts, gold, judge, tokenizer)
    decision = _decide(scores, samples, g, sc.run.seed)
    gold_tags = {} if gold is None or scorer == "judge" else _gold_tags(
        decision, _decide(_scores(sc, "judge", samples, prompts, gold, None, tokenizer),
                          samples, g, sc.run.seed))
    decision = taxed(decision, tax, sc.cfg)
    sc.log_table(side_by_side(prompts, samples, scores), SIDE_BY_SIDE)
    if tax_rows:
        sc.log_table(pd.DataFrame(tax_rows), TAX_PROBE)
    space = "gate" if compared is None else "compare"
    metrics = {f"{space}/{k}": float(v) for k, v in decision["figures"].items()}
    metrics[f"{space}/promote" if compared is None else "compare/better"] = \
        float(decision["promote"])
    metrics.update(tax)  # eval/tax/*: the register stage reads them as evaluate's
    sc.log(0, metrics)
    sc.log_parent(metrics)
    key = "eval/judge_score_policy" if scorer == "judge" else "eval/rm_score_policy"
    label = scorer_label(scorer)
    tags = {GATE_DECISION_TAG: "promote" if decision["promote"] else "keep",
            GATE_REASON_TAG: decision["reason"], GATE_SCORER_TAG: label,
            GATE_SCORER_ID_TAG: scorer, **gold_tags,
            **{GATE_PREFIX + k: f"{v:.6g}" if isinstance(v, float) else str(v)
               for k, v in decision["figures"].items()}}
    if compared is not None:
        tags = compare_tags(tags, decision["promote"], compared)
    sc.set_tags(tags, parent=True)
    sc.set_tags(tags)
    markdown = decision_markdown(sc.run, sc.run_id, decision, label, champion.version,
                                 gold_tags, summary_line(tax, sc.cfg.eval.tax.budget)
                                 if tax else "")
    if compared is None:
        report("rlhf-retrain-decision", markdown, "retrain: challenger vs champion")
    else:
        verdict = "better" if decision["promote"] else "not significantly better"
        report("rlhf-compare", f"# Compare {compared}: {verdict}\n\n" +
               markdown.split("\n", 2)[2], "compare: two registered versions")
    return GateRecord(decision=Decision(promote=decision["promote"],
                                        reason=decision["reason"], scorer=label),
                      metrics={key: decision["figures"]["score_challenger"], **metrics},
                      figures={"decision": tags.get(GATE_DECISION_TAG) or
                               tags[COMPARE_RESULT_TAG], "scorer": label})


# compare/*: `rlhf compare`'s; eval/tax/*: the challenger's tax, named as evaluate names it
STAGE = Stage("gate", body, GateRecord, seed_offset=4,
              metrics=("gate/*", "compare/*", "eval/tax/probe_acc_*", "eval/tax/probe_diff_*_*",
                       "eval/tax/bpb_*"),
              artifacts=(SIDE_BY_SIDE, TAX_PROBE))

gate = stage_task(STAGE)
