"""The pipeline's champion rule (stage register): compare evaluation scores only when the same
scorer scored both policies on the same prompts; else register a challenger and leave the
champion. The decision read from a real MLflow store (SQLite) with hand-made versions."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from tasks.champion.rule import champion_evaluation, eval_scorer, register_decision, score_key
from tasks.tracking.tags import EVAL_SCORER_TAG

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
    from tasks.champion.rule import Decision

    assert register_decision(None, None, KEY, 1.0).register_tag == "first"
    assert Decision(promote=False, reason="r", scorer="judge").register_tag == "gate: keep"
    assert Decision(promote=True, reason="r", scorer="judge").register_tag == "gate: promote"


# -- a policy PPO's health watch flagged ------------------------------------------------------
STOPPED = "PPO was stopped by its kl_spike detector, the policy kept is its snapshot of " \
    "iteration 12"


def test_a_flagged_policy_is_not_made_champion_and_the_refusal_says_why():
    from tasks.champion.rule import Decision, health_veto

    first = register_decision(None, JUDGE, KEY, 1.0)
    vetoed = health_veto(first, STOPPED, override=False)
    assert vetoed.promote is False and vetoed.register_tag == "health"
    assert vetoed.reason.startswith(f"not made champion: {STOPPED}")
    assert "tracking.promote_flagged" in vetoed.reason and first.reason in vetoed.reason
    gate = Decision(promote=True, reason="significant win", scorer="judge")
    assert health_veto(gate, STOPPED, override=False).promote is False
    # the override promotes, saying so; a healthy policy and a kept champion pass untouched
    forced = health_veto(first, STOPPED, override=True)
    assert forced.promote is True and "promoted although PPO was stopped" in forced.reason
    assert health_veto(first, None, override=False) == first
    kept = Decision(promote=False, reason="no significant win", scorer="judge")
    assert health_veto(kept, STOPPED, override=False) == kept


def test_the_health_record_says_what_blocks_a_champion():
    from tasks.stages.records import HealthFinding, HealthRecord

    def finding(detector):
        return HealthFinding(detector=detector, failure="f", iteration=9, onset=8,
                             last_healthy=6, action="warn", message="m", advice="a")

    assert HealthRecord().blocks_champion is None
    assert HealthRecord(findings=[finding("entropy_collapse")]).blocks_champion is None
    assert HealthRecord(findings=[finding("reward_hacking")]).blocks_champion == \
        "PPO's reward_hacking detector fired"
    stopped = HealthRecord(findings=[finding("kl_spike")], stopped_by="kl_spike",
                           restored_iteration=12)
    assert stopped.blocks_champion == STOPPED
    assert stopped.lines() == ["PPO health: f (kl_spike) at iteration 9: m. Advice: a.",
                               f"PPO stopped: {STOPPED}."]


def test_rlhf_promote_refuses_a_flagged_version_without_flagged(tmp_path):
    from tasks.tracking.errors import RegistryError
    from tasks.tracking.registry import CHAMPION, alias_version, promote
    from tasks.tracking.tags import HEALTH_FLAGS_TAG, HEALTH_STOPPED_TAG

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
