"""Each stage body under a fake StageContext (tests/fake_stage.py): no Prefect, no tracking
server. The bodies run in pipeline order on the tiny GPT-2 and rows of tests/shared.py; each
test checks the record the body returns and what it logged, tagged and published, and that
what each body logs is what its table entry declares (the names docs/design.md lists)."""

from __future__ import annotations

import inspect
import json
import sys
from fnmatch import fnmatchcase
from pathlib import Path

import pytest
import torch

from data_checks.config import DataSource
from rlhf_core.config import RewardSource
from tasks.config.pipeline_config import load_config
from tasks.pipeline.stages.critic_init import FROM_POLICY, FROM_RM
from tasks.pipeline.stages.records import (
    Artifact,
    DataRecord,
    ModelRecord,
    NormRecord,
    PolicyRecord,
    RegisterRecord,
)
from tasks.pipeline.stages.table import DISTRIBUTED
from tasks.retrain.gate.champion import Champion
from tests.fake_stage import FakeStageContext
from tests.shared import (
    PREF,
    PROMPTS,
    assert_decision_follows_figures,
    every_stage,
    length_scorer,
    prepared_for,
    write_config,
    write_jsonl,
)
from tests.tasks.pipeline import reward_fns

STAGES = every_stage()  # the pipeline's table and the retrain's gate


def _runner(cfg, work: Path, done: dict):
    """run(name, **inputs) -> the record of the stage's body under a fake context in
    ``work``, kept in ``done[name]`` with the context (``cfg=``: another config)."""

    def run(name: str, tracked: bool = False, cfg=cfg, **inputs):
        sc = FakeStageContext(cfg, name, work, seed=cfg.seed, tracked=tracked)
        done[name] = (sc, STAGES[name].body(sc, **inputs))
        return done[name][1]

    return run


def _champion(sft: ModelRecord, rm: ModelRecord) -> Champion:
    return Champion(version="1", sft_run_id=sft.run_id, ancestry="v1", policy_dir=sft.model.path,
                    rm_dir=rm.model.path, sft_dir=sft.model.path)


@pytest.fixture(scope="module")
def chain(tmp_path_factory, tiny_model_dir):
    """(cfg, prep, workdir, {stage: (fake context, record)}) for the whole pipeline."""
    tmp = tmp_path_factory.mktemp("bodies")
    cfg = load_config(write_config(tmp, tiny_model_dir), ["seed=3", "retrain.gate.min_prompts=6"])
    eval_prompts = DataSource(path=str(write_jsonl(tmp / "eval.jsonl", PROMPTS * 3)))
    work = tmp / "work"
    prep = prepared_for(cfg, work, cfg.data.model_copy(update={"eval_prompts": eval_prompts}),
                     tiny_model_dir)
    done: dict = {}
    run = _runner(cfg, work, done)
    d = run("validate", prep=prep)
    s = run("sft", prep=prep, data=d)
    rm = run("reward_model", prep=prep, data=d, start=s)
    norm = run("reward_norm", data=d, rm=rm)
    judge = run("judge_model", data=d, start=s)
    critic = run("critic_init", rm=rm, start=s)
    pol = run("ppo", prep=prep, data=d, start=s, rm=rm, norm=norm, critic=critic, judge=judge)
    ev = run("evaluate", prep=prep, data=d, sft=s, rm=rm, policy=pol)
    run("register", tracked=True, policy=pol, evaluation=ev, rm=rm, data=d)
    run("gate", prep=prep, data=d, champion=_champion(s, rm), policy=pol, rm=rm,
        reference_dir=s.model.path, judge=judge)
    return cfg, prep, work, done


@pytest.fixture(scope="module")
def judged(chain, tmp_path_factory):
    """{stage: (fake context, record)} of the bodies whose logs change with a gold judge,
    held-out pairs, a critic-free estimator with its KL in the loss, the pretraining mix (SFT's
    and PPO's), a reward function beside the reward model, or `rlhf compare`."""
    cfg, prep, _, done = chain
    tmp = tmp_path_factory.mktemp("judged")
    pairs = DataSource(path=str(write_jsonl(tmp / "pref_eval.jsonl", PREF)))
    prep = prep.model_copy(update={"judge": "demo", "data": prep.data.model_copy(
        update={"preference_eval": pairs})})
    # and a health detector that fires at once and stops PPO (the rollout's share of time)
    health = cfg.ppo.health.model_copy(update={"slow_rollout": cfg.ppo.health.slow_rollout
                                               .model_copy(update={"window": 1, "max_share":
                                                                   0.001, "action": "stop"})})
    # and InstructGPT's pretraining mix on raw text
    (tmp / "pretrain.txt").write_text("the rain is nice .\n\nsure , cats are good .\n")
    # and a reward from the reward model and a Python function
    sources = (*cfg.ppo.reward_sources, RewardSource(
        name="brevity", kind="function", target="tests.tasks.pipeline.reward_fns:brevity",
        weight=0.5))
    grpo = cfg.model_copy(update={"ppo": cfg.ppo.model_copy(update={
        "advantage_estimator": "grpo", "samples_per_prompt": 2, "kl_in_loss": True,
        "health": health, "iterations": 3, "ptx_coef": 0.5, "reward_sources": sources}),
        "data": cfg.data.model_copy(
        update={"pretrain": DataSource(path=str(tmp / "pretrain.txt"))}),
        "sft": cfg.sft.model_copy(update={"ptx_coef": 0.5})})
    s, norm, critic = (done[name][1] for name in ("sft", "reward_norm", "critic_init"))
    out: dict = {}
    run = _runner(cfg, tmp / "work", out)
    d = run("validate", prep=prep)
    run("sft", cfg=grpo, prep=prep, data=d)  # SFT with the mix (PPO starts from chain's)
    rm = run("reward_model", prep=prep, data=d, start=s)
    reward_fns.CALLS.clear()  # the calls of this PPO's function source only
    pol = run("ppo", cfg=grpo, prep=prep, data=d, start=s, rm=rm, norm=norm, critic=critic)
    ev = run("evaluate", prep=prep, data=d, sft=s, rm=rm, policy=pol)
    # the stopped policy, registered under a new name (the rule would make it first champion)
    fresh = cfg.model_copy(update={"tracking": cfg.tracking.model_copy(
        update={"registered_policy": "flagged-policy"})})
    run("register", tracked=True, cfg=fresh, policy=pol, evaluation=ev, rm=rm, data=d)
    run("gate", prep=prep, data=d, champion=_champion(s, rm), policy=pol, rm=rm,
        reference_dir=s.model.path, compared="v2 against v1")
    return out


def test_the_table_names_each_stage_once_with_its_record_and_seed():
    assert list(STAGES) == ["validate", "sft", "reward_model", "reward_norm", "judge_model",
                            "critic_init", "ppo", "evaluate", "register", "gate"]
    assert DISTRIBUTED == ("sft", "reward_model", "ppo")
    offsets = [s.seed_offset for s in STAGES.values() if s.seed_offset is not None]
    assert len(offsets) == len(set(offsets))  # no two stages draw the same random numbers
    assert STAGES["ppo"].record is PolicyRecord and STAGES["sft"].sections == ("sft", "model")
    for name, stage in STAGES.items():  # each entry is the STAGE of the file its body is in
        assert stage.name == name and sys.modules[stage.body.__module__].STAGE is stage


def test_routable_stages_in_the_config_are_the_tables():
    """tasks/config/sections.py cannot import the table (an import circle): its copy is held
    here."""
    from tasks.config.sections import ROUTABLE

    assert ROUTABLE == DISTRIBUTED


def test_each_stage_task_is_derived_from_its_table_entry():
    """Named after the stage, its parameters ``ctx``, ``cfg`` and the body's inputs, one
    Prefect task key per stage."""
    keys = set()
    for name, stage in STAGES.items():
        task = getattr(sys.modules[stage.body.__module__], name)
        assert task.name == name and task.fn.__name__ == name
        assert list(inspect.signature(task).parameters) == \
            ["ctx", "cfg", *(p.name for p in stage.inputs)]
        assert task.description == sys.modules[stage.body.__module__].__doc__
        keys.add(task.task_key)
    assert len(keys) == len(STAGES)


def test_recorded_inputs_come_back_as_the_records_the_body_names():
    """A stage's inputs are recorded as JSON; read back (a resume, a routed stage) they are
    the typed records again, the champion's downloaded folders included."""
    from tasks.pipeline.stages.run import typed_inputs

    recorded = json.loads(json.dumps({
        "champion": {"version": "3", "sft_run_id": "r1", "ancestry": "v1>v3",
                     "policy_dir": "/c/policy", "rm_dir": "/c/rm", "sft_dir": "/c/sft"},
        "policy": {"policy": {"path": "/p", "uri": "runs:/r/checkpoint/policy"}},
        "judge": None, "reference_dir": "/c/sft"}))
    inputs = typed_inputs(STAGES["gate"], recorded)
    assert inputs["champion"] == Champion(version="3", sft_run_id="r1", ancestry="v1>v3",
                                          policy_dir="/c/policy", rm_dir="/c/rm",
                                          sft_dir="/c/sft")
    assert isinstance(inputs["policy"], PolicyRecord) and inputs["policy"].policy.path == "/p"
    assert inputs["judge"] is None and inputs["reference_dir"] == "/c/sft"


def test_validate_cleans_the_data_and_saves_the_tokenizer(chain):
    _, _, work, done = chain
    sc, rec = done["validate"]
    assert isinstance(rec, DataRecord)
    assert (Path(rec.data.path) / "sft.jsonl").exists()
    assert (Path(rec.tokenizer.path) / "tokenizer_config.json").exists()
    assert rec.metrics["sft/n_rows"] == 2 and rec.figures
    assert sc.artifacts["data/tokenizer"] == rec.tokenizer.path
    assert "validation_summary.md" in sc.artifacts and "data_docs" in sc.artifacts
    assert "data/sft.jsonl" in sc.artifacts  # small data: copied (log_cleaned_data_max_mb)
    assert sc.metrics[0]["sft/n_rows"] == 2
    assert "rlhf.tokenizer.eos_token" in sc.tags
    assert sc.parent_tags["rlhf.data_digest.sft"] == "digest-of-sft.jsonl"


def test_validate_logs_a_sample_and_copies_the_cleaned_files_only_while_small(tmp_path,
                                                                           tiny_model_dir):
    """tracking.log_cleaned_data_max_mb: at 0 no cleaned file goes to MLflow, yet the run
    folder holds them and their token files, and data_docs/ holds a sample of each."""
    cfg = load_config(write_config(tmp_path, tiny_model_dir),
                      ["tracking.log_cleaned_data_max_mb=0"])
    prep = prepared_for(cfg, tmp_path / "work", cfg.data, tiny_model_dir)
    sc = FakeStageContext(cfg, "validate", tmp_path / "work")
    rec = STAGES["validate"].body(sc, prep=prep)
    assert not [a for a in sc.artifacts if a.startswith("data/") and a.endswith(".jsonl")]
    for name in ("sft", "preference", "prompts"):
        cleaned = Path(rec.data.path) / f"{name}.jsonl"
        assert cleaned.exists() and (Path(rec.data.path) / f"{name}.tokens.arrow").exists()
        sample = Path(rec.data.path) / "data_docs" / "sample" / f"{name}.jsonl"
        assert sample.read_text().splitlines() == cleaned.read_text().splitlines()[:20]
    assert sc.parent_tags["rlhf.data_digest.sft"] == "digest-of-sft.jsonl"


def test_validate_stops_on_bad_rows_before_anything_is_published(tmp_path, tiny_model_dir):
    from data_checks.validate import ValidationFailed

    cfg = load_config(write_config(tmp_path, tiny_model_dir, sft_text='{"prompt": ""}\n'))
    prep = prepared_for(cfg, tmp_path / "work", cfg.data, tiny_model_dir)
    sc = FakeStageContext(cfg, "validate", tmp_path / "work")
    with pytest.raises((ValidationFailed, ValueError)):
        STAGES["validate"].body(sc, prep=prep)
    assert "data/tokenizer" not in sc.artifacts


@pytest.mark.parametrize("stage", ["sft", "reward_model", "critic_init", "judge_model"])
def test_model_stages_save_and_publish_their_model(chain, stage):
    _, _, _, done = chain
    sc, rec = done[stage]
    assert isinstance(rec, ModelRecord)
    assert list(Path(rec.model.path).glob("*.safetensors"))
    assert rec.model.uri.startswith(f"runs:/{sc.run_id}/checkpoint")
    assert rec.metrics and all(v == v for v in rec.metrics.values())


def test_sft_logs_its_loss_and_checkpoints_in_its_folder(chain):
    _, _, work, done = chain
    sc, rec = done["sft"]
    assert "sft/response_loss_train" in sc.metrics[0] and "train/loss" in rec.metrics
    assert sc.artifacts["checkpoint"] == rec.model.path
    assert Path(rec.model.path).is_relative_to(work / "sft")


def test_reward_model_reports_held_out_accuracy_on_both_runs(chain):
    sc, rec = chain[3]["reward_model"]
    assert 0.0 <= rec.metrics["eval/rm_accuracy"] <= 1.0
    assert sc.parent_metrics == {"eval/rm_accuracy": rec.metrics["eval/rm_accuracy"]}
    assert "eval/rm_gold_accuracy" not in rec.metrics  # no gold judge for these rows


def test_reward_norm_centres_the_scores(chain):
    sc, rec = chain[3]["reward_norm"]
    assert isinstance(rec, NormRecord) and rec.stats["n"] == 2
    assert json.loads(Path(rec.stats_file.path).read_text()) == rec.stats
    assert abs(sc.metrics[0]["reward/normalised_mean"]) < 1e-3


def test_critic_init_copies_the_reward_model_and_names_its_source(chain):
    _, _, _, done = chain
    sc, rec = done["critic_init"]
    rm = done["reward_model"][1]
    assert rec.source == rm.model.uri and sc.tags["rlhf.critic_source"] == rm.model.uri
    assert (Path(rec.model.path) / "head.safetensors").read_bytes() == \
        (Path(rm.model.path) / "head.safetensors").read_bytes()
    assert not rec.fresh_head and rec.figures == {"critic": FROM_RM}


ONLY_A_FUNCTION = (RewardSource(name="brevity", kind="function",
                                target="tests.tasks.pipeline.reward_fns:brevity"),)


@pytest.fixture(scope="module")
def fresh(chain, tmp_path_factory):
    """{stage: (fake context, record)} of critic_init and PPO when the reward is a function's
    alone, reward_norm's mean moved to 10 (what PPO would put on a warm-started head)."""
    cfg, prep, _, done = chain
    cfg = cfg.model_copy(update={"ppo": cfg.ppo.model_copy(
        update={"reward_sources": ONLY_A_FUNCTION})})
    d, s, rm, norm, judge = (done[k][1] for k in ("validate", "sft", "reward_model",
                                                  "reward_norm", "judge_model"))
    out: dict = {}
    run = _runner(cfg, tmp_path_factory.mktemp("fresh"), out)
    critic = run("critic_init", rm=rm, start=s)
    far = norm.model_copy(update={"stats": {**norm.stats, "mean": 10.0}})
    run("ppo", prep=prep, data=d, start=s, rm=rm, norm=far, critic=critic, judge=judge)
    return out


def test_with_no_reward_model_among_the_sources_the_critic_starts_from_the_sft_policy(
        chain, fresh):
    from safetensors.torch import load_file

    from rlhf_core.models.loader import LoadSpec, load_pretrained

    sft, rm = chain[3]["sft"][1], chain[3]["reward_model"][1]
    sc, rec = fresh["critic_init"]
    assert rec.fresh_head and rec.source == sft.model.uri == sc.tags["rlhf.critic_source"]
    assert rec.figures == {"critic": FROM_POLICY}
    assert rec.model.uri.startswith(f"runs:/{sc.run_id}/checkpoint")
    critic = load_pretrained(rec.model.path, LoadSpec(), "scalar").backbone.state_dict()
    trunk = load_pretrained(sft.model.path, LoadSpec()).base_model.state_dict()
    assert critic.keys() == trunk.keys()
    assert all(torch.equal(v, trunk[k]) for k, v in critic.items())  # the SFT policy's trunk
    head = load_file(str(Path(rec.model.path) / "head.safetensors"))
    assert not torch.equal(head["weight"],
                           load_file(str(Path(rm.model.path) / "head.safetensors"))["weight"])
    ppo_sc, pol = fresh["ppo"]
    first = ppo_sc.metrics[1]
    assert "reward/brevity/raw_mean" in first and "reward/rm/raw_mean" not in first
    assert "loss/value_avg" in first and pol.value_dir is not None
    # PPO trained the new head but did not shift it by reward_norm's mean (10)
    end = load_file(str(Path(pol.value_dir) / "head.safetensors"))["bias"]
    assert abs(float(end - head["bias"])) < 1.0


@pytest.mark.parametrize("sources", [None, ONLY_A_FUNCTION])
def test_critic_init_under_lora_names_the_folder_ppo_adapts(chain, tmp_path, sources):
    """With model.lora nothing is copied: the record names the reward model's folder, or the
    start policy's (the critic a new head on it) when the reward model is no source; there
    PPO trains the critic's adapter over that policy and saves it so that it loads back."""
    pytest.importorskip("peft")
    from rlhf_core.config import LoraSettings
    from rlhf_core.models.adapters import base_of
    from rlhf_core.models.loader import LoadSpec, load_pretrained

    cfg, prep, _, done = chain
    sft, rm = done["sft"][1], done["reward_model"][1]
    ppo = cfg.ppo if sources is None else \
        cfg.ppo.model_copy(update={"reward_sources": sources})
    cfg = cfg.model_copy(update={"ppo": ppo, "model": cfg.model.model_copy(
        update={"lora": LoraSettings(r=4)})})
    sc = FakeStageContext(cfg, "critic_init", tmp_path)
    rec = STAGES["critic_init"].body(sc, rm=rm, start=sft)
    src = rm if sources is None else sft
    assert rec.model == src.model and rec.fresh_head is (sources is not None)
    assert rec.source == sc.tags["rlhf.critic_source"] == src.model.uri
    assert rec.figures["critic"].startswith(FROM_RM if sources is None else FROM_POLICY)
    assert "LoRA" in rec.figures["critic"] and not (tmp_path / "critic_init").exists()
    if sources is None:
        return
    sc = FakeStageContext(cfg, "ppo", tmp_path, seed=cfg.seed)
    pol = STAGES["ppo"].body(sc, prep=prep, data=done["validate"][1], start=sft, rm=rm,
                             norm=done["reward_norm"][1], critic=rec,
                             judge=done["judge_model"][1])
    assert "loss/value_avg" in sc.metrics[1]
    assert base_of(pol.value_dir) == sft.model.path  # the adapter over the SFT policy
    load_pretrained(pol.value_dir, LoadSpec(), "scalar", trainable=False)  # loads back merged


def test_critic_init_without_a_critic_saves_nothing(chain, tmp_path):
    cfg = chain[0]
    cfg = cfg.model_copy(update={"ppo": cfg.ppo.model_copy(
        update={"advantage_estimator": "rloo"})})
    sc = FakeStageContext(cfg, "critic_init", tmp_path)
    none = ModelRecord(model=Artifact(path=str(tmp_path / "none")))
    rec = STAGES["critic_init"].body(sc, rm=none, start=none)
    assert rec.model is None and "no critic" in sc.tags["rlhf.critic_skipped"]


def test_ppo_trains_logs_each_iteration_and_keeps_samples(chain):
    cfg, _, _, done = chain
    sc, rec = done["ppo"]
    assert isinstance(rec, PolicyRecord) and rec.value_dir is not None
    assert (Path(rec.policy.path) / "config.json").exists()
    assert {"objective/kl", "objective/scores"} <= set(sc.metrics[1])
    assert "memory/model_state_gb" in rec.metrics
    assert "samples/all.json" in sc.tables
    assert sc.checkpoint_dir.is_relative_to(sc.dir)


def test_evaluate_compares_both_policies_on_held_out_prompts(chain):
    sc, rec = chain[3]["evaluate"]
    assert "eval/kl_to_ref" in rec.metrics and rec.scorer
    assert sc.parent_metrics == sc.metrics[0]
    assert sc.parent_tags["rlhf.eval.scorer"] == rec.scorer
    assert len(sc.tables["eval/side_by_side.json"]) == sc.cfg.eval.num_prompts == 2


def test_evaluate_measures_the_alignment_tax_of_a_pretrained_base(chain, tmp_path):
    """The base (model.base_model), SFT and PPO policies answer the probe and score the text;
    the same SFT policy as its own PPO policy pays no tax against the SFT, and a run without
    the tax says it does not apply."""
    sc, rec = chain[3]["evaluate"]
    m = rec.metrics
    for name in ("base", "sft", "policy"):
        assert 0 <= m[f"eval/tax/probe_acc_{name}"] <= 1 and m[f"eval/tax/bpb_{name}"] > 0
    table = sc.tables["eval/tax_probe.json"]
    assert len(table) >= 150 and {"question", "expected", "base_answer", "policy_right"} <= \
        set(table[0])
    assert rec.tax.startswith("alignment tax: probe accuracy base ")
    cfg, prep, _, done = chain
    d, s, rm, pol = (done[name][1] for name in ("validate", "sft", "reward_model", "ppo"))
    same = _runner(cfg, tmp_path / "same", {})("evaluate", prep=prep, data=d, sft=s, rm=rm,
                                                policy=pol.model_copy(update={"policy": s.model}))
    assert same.metrics["eval/tax/probe_diff_policy_sft"] == 0.0
    assert same.metrics["eval/tax/bpb_policy"] == same.metrics["eval/tax/bpb_sft"]
    off = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={
        "tax": cfg.eval.tax.model_copy(update={"enabled": False})})})
    none = _runner(off, tmp_path / "off", {})("evaluate", prep=prep, data=d, sft=s, rm=rm,
                                               policy=pol)
    assert not any(k.startswith("eval/tax/") for k in none.metrics)
    assert none.tax == "alignment tax: does not apply: no pretrained base (model.base_model) " \
        "to lose anything"


def test_evaluate_samples_both_policies_from_one_random_stream(chain, tmp_path):
    """The SFT policy evaluated as its own PPO policy: the same answers (common random
    numbers), so the paired comparison with its start is exactly 0, not sampling noise."""
    cfg, prep, _, done = chain
    d, s, rm, pol = (done[name][1] for name in ("validate", "sft", "reward_model", "ppo"))
    run = _runner(cfg, tmp_path, {})
    ev = run("evaluate", prep=prep.model_copy(update={"judge": "demo"}), data=d, sft=s, rm=rm,
             policy=pol.model_copy(update={"policy": s.model}))
    m = ev.metrics
    assert m["eval/vs_start_diff"] == m["eval/vs_start_diff_low"] == 0.0
    assert m["eval/vs_start_diff_high"] == 0.0 and m["eval/judge_win_rate"] == 0.5
    assert m["eval/rm_score_policy"] == m["eval/rm_score_sft"]


def test_register_registers_both_models_and_makes_the_first_champion(chain):
    sc, rec = chain[3]["register"]
    assert isinstance(rec, RegisterRecord) and rec.registered and rec.promoted
    version = sc.client.get_model_version_by_alias(rec.model_name, "champion")
    assert int(version.version) == rec.version
    assert version.tags["rlhf.ppo_run_id"] == chain[3]["ppo"][1].run_id
    assert sc.parent_tags["rlhf.ancestry"] == f"v{rec.version}"


def test_a_stopped_ppo_keeps_a_healthy_snapshot_and_says_so_everywhere(judged):
    sc, rec = judged["ppo"]
    health = rec.health
    assert health.stopped_by == "slow_rollout" and health.flags == ["slow_rollout"]
    (finding,) = health.findings
    assert finding.action == "stop" and finding.iteration == 2 and finding.advice
    assert health.restored_iteration == 0 and health.checks == 3  # iterations 0, 1, 2
    assert rec.figures == {"stopped by": "slow_rollout at iteration 2",
                           "policy kept": "iteration 0"}
    for tags, tables in ((sc.tags, sc.tables), (sc.parent_tags, sc.parent_tables)):
        assert tags["rlhf.health.flags"] == "slow_rollout"
        assert tags["rlhf.health.slow_rollout"] == finding.message
        assert tags["rlhf.health.stopped"].startswith("stopped at iteration 2 by slow_rollout")
        assert [r["detector"] for r in tables["health.json"]] == ["slow_rollout"]
    assert sorted(t for t in sc.tables if t.startswith("checks/")) == \
        ["checks/iter_00000.json", "checks/iter_00001.json", "checks/iter_00002.json"]


def test_a_reward_function_beside_the_reward_model_is_called_logged_and_tagged(judged):
    sc, _ = judged["ppo"]
    first = sc.metrics[1]
    for name in ("rm", "brevity"):
        assert {f"reward/{name}/{k}" for k in ("raw_mean", "raw_std", "mean", "std",
                                               "abstain_rate")} <= set(first)
    assert first["reward/brevity/raw_mean"] <= 0  # minus the words
    assert sc.tags["rlhf.reward_source.brevity"].startswith(
        "function tests.tasks.pipeline.reward_fns:brevity, weight 0.5 [sha256 ")
    assert sc.tags["rlhf.reward_source.rm"] == "model the run's reward model, weight 1.0"
    call = reward_fns.CALLS[0]  # the prompts as the data hold them, a row per rollout
    prompts = {r["prompt"] for r in PROMPTS}
    assert set(call["prompts"]) <= prompts and len(call["completions"]) == len(call["prompts"])


def test_register_keeps_a_stopped_policy_from_champion_and_says_why(judged):
    sc, rec = judged["register"]
    assert rec.registered and not rec.promoted
    assert rec.reason.startswith("not made champion: PPO was stopped by its slow_rollout")
    version = sc.client.get_model_version("flagged-policy", str(rec.version))
    assert version.tags["rlhf.register.decision"] == "health"
    assert version.tags["rlhf.health.flags"] == "slow_rollout"
    assert "stopped by its slow_rollout" in version.tags["rlhf.health.stopped"]
    assert "champion" not in version.aliases


def test_gate_decides_with_the_judge_reward_model(chain):
    sc, rec = chain[3]["gate"]
    assert rec.decision.scorer == "held-out judge reward model"
    assert_decision_follows_figures(sc.tags, sc.cfg.retrain.gate.margin)
    assert sc.tags == sc.parent_tags and "gate/promote" in sc.metrics[0]


def _logged(sc: FakeStageContext) -> tuple[set[str], set[str]]:
    """(metric names, artifact paths) a body logged through its context: ``log``, ``live``
    and ``log_parent``; ``publish``, ``log_artifact(s)``, ``log_text`` and ``log_table``."""
    metrics = {k for step in sc.metrics.values() for k in step} | set(sc.parent_metrics)
    return metrics, set(sc.artifacts) | set(sc.tables)


def _matching(names, patterns) -> set[str]:
    return {n for n in names if any(fnmatchcase(n, p) for p in patterns)}


# declared names no body run here logs: the peak GPU memory needs CUDA
UNREACHED = {"memory/peak_gpu_gb"}


def test_each_body_logs_only_the_names_its_table_entry_declares(chain, judged):
    for sc, _ in [*chain[3].values(), *judged.values()]:
        metrics, artifacts = _logged(sc)
        assert metrics - _matching(metrics, sc.stage.metrics) == set(), sc.stage.name
        assert artifacts - _matching(artifacts, sc.stage.artifacts) == set(), sc.stage.name


def test_every_name_a_table_entry_declares_is_logged_by_a_run_of_its_body(chain, judged):
    logged: dict[str, tuple[set[str], set[str]]] = {name: (set(), set()) for name in STAGES}
    for sc, _ in [*chain[3].values(), *judged.values()]:
        for seen, names in zip(logged[sc.stage.name], _logged(sc)):
            seen |= names
    for name, stage in STAGES.items():
        for declared, seen in zip((stage.metrics, stage.artifacts), logged[name]):
            missing = {p for p in declared if not _matching(seen, [p])} - UNREACHED
            assert not missing, (name, sorted(missing))


def test_a_registered_scorer_scores_the_held_out_checks_in_the_judges_place(chain, tmp_path):
    """``ppo.health.scorer: models:/<name>@<alias>``: no judge reward model; the registered
    pyfunc scores every check's answers; a missing alias stops the run before it starts."""
    import mlflow
    from mlflow import MlflowClient

    from tasks.pipeline.prepare import check_registered_scorer
    from tasks.platform.mlflow.models import mlflow_pointed_at

    cfg, prep, _, done = chain
    uri = f"sqlite:///{tmp_path}/mlflow.db"  # where the fake context's stage runs track
    with mlflow_pointed_at(uri), mlflow.start_run():
        info = mlflow.pyfunc.log_model(name="scorer", python_model=length_scorer(),
                                       registered_model_name="len-judge")
    MlflowClient(uri).set_registered_model_alias("len-judge", "prod",
                                                 info.registered_model_version)
    health = cfg.ppo.health.model_copy(update={"scorer": "models:/len-judge@prod"})
    scored = cfg.model_copy(update={"ppo": cfg.ppo.model_copy(update={"health": health,
                                                                      "iterations": 2}),
                                    "tracking": cfg.tracking.model_copy(
                                        update={"tracking_uri": uri})})
    assert not scored.ppo.health.uses_judge  # the pipeline trains no judge_model
    check_registered_scorer(scored)
    missing = scored.model_copy(update={"ppo": scored.ppo.model_copy(update={
        "health": health.model_copy(update={"scorer": "models:/len-judge@nope"})})})
    with pytest.raises(ValueError, match="ppo.health.scorer=models:/len-judge@nope: no version"):
        check_registered_scorer(missing)
    inputs = {k: done[k][1] for k in ("sft", "reward_model", "reward_norm", "critic_init")}
    sc = FakeStageContext(scored, "ppo", tmp_path, seed=cfg.seed)
    STAGES["ppo"].body(sc, prep=prep, data=done["validate"][1], start=inputs["sft"],
                       rm=inputs["reward_model"], norm=inputs["reward_norm"],
                       critic=inputs["critic_init"])
    rows = sc.tables["checks/iter_00002.json"]
    assert [r["judge_score"] for r in rows] == [float(len(r["response"])) for r in rows]
