"""The retrain flow in-process against the session's Prefect test server, on a tiny config.

One module-scoped sequence (each step needs the registry the previous left):
(a) no champion -> bootstrap; (d) no new batch -> nothing trained; (e) malformed batch ->
fails at validate, unconsumed, champion untouched; (b) good batch -> champion moves;
(g) another retrain holds the slot -> skipped, nothing trained; (c) degraded batch -> kept,
reason recorded.

Making (b) and (c) reliable on a tiny model: the bootstrap champion is deliberately weak (1
PPO iteration), so the good batch's 10 iterations win clearly (measured: judge +2.8, 95% CI
[+2.3, +3.3]); the degraded case trains its RM on the reversed batch alone (rm_data new_only,
fresh head on SFT). Part of any PPO gain here is EOS learning (the EOS trick), which a reversed
RM still rewards, so the gate asks for a margin of 1.5 judge points, which the good batch
clears and the degraded one does not (measured: +0.29 to +0.66, CI lower ends -0.12 to +0.26).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from data_checks.validate import ValidationFailed
from flows.config import load_config
from rlhf_core.demo import write_preference_batch
from tasks.registry import CHAMPION, PREVIOUS, alias_version
from tasks.retrain import consumed_digests, file_digest
from tests.shared import registered_models_panel

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "test.yaml"
POLICY = "rlhf-policy"


def _config(tmp: Path, *extra: str):
    return load_config(CONFIG, [
        f"tracking.tracking_uri=sqlite:///{tmp}/mlflow.db", f"tracking.workdir={tmp}/runs",
        "tracking.system_metrics=false", f"retrain.watch_dir={tmp}/batches",
        "demo.n_eval=200", "retrain.gate.num_prompts=200", "ppo.iterations=1",
        "retrain.ppo_iterations=10", "retrain.gate.margin=1.5", *extra])


def _retrain_parents(client: MlflowClient) -> list:
    exp = client.get_experiment_by_name("rlhf-test")
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`rlhf.retrain` = 'true'")
    return [r for r in runs if "mlflow.parentRunId" not in r.data.tags]


@pytest.fixture(scope="module")
def sequence(tmp_path_factory, prefect_api):
    from flows.retrain import retrain

    tmp = tmp_path_factory.mktemp("retrain")
    cfg = _config(tmp)
    client = MlflowClient(cfg.tracking.tracking_uri)
    batches = tmp / "batches"
    out, wall = {}, {}

    def step(name, config=cfg):
        start = time.perf_counter()
        try:
            out[name] = retrain(config=config)
        except Exception as err:  # noqa: BLE001 - the malformed case is asserted below
            out[name] = err
        wall[name] = time.perf_counter() - start
        out[f"{name}/champion"] = alias_version(client, POLICY, CHAMPION)
        out[f"{name}/parents"] = len(_retrain_parents(client))

    step("a_bootstrap")
    step("d_nothing_new")
    batches.mkdir(parents=True, exist_ok=True)
    bad = batches / "batch-bad.jsonl"
    bad.write_text(json.dumps({"prompt": "user : describe cats assistant :", "chosen": "x",
                               "rejected": "x"}) + "\n"
                   + json.dumps({"prompt": "", "chosen": "a", "rejected": "b"}) + "\n")
    out["bad_digest"] = file_digest(bad)
    step("e_malformed")
    out["e_malformed/consumed"] = consumed_digests(cfg)
    bad.unlink()  # the user removes (or fixes) the batch the gate refused
    out["good_digest"] = file_digest(write_preference_batch(batches, 256, seed=11))
    step("b_good")
    from prefect.concurrency.sync import concurrency

    from flows.retrain import ensure_limit, limit_name

    ensure_limit(limit_name(cfg))
    write_preference_batch(batches, 2000, seed=12, degraded=True)
    with concurrency(limit_name(cfg), occupy=1, strict=True):
        step("g_overlap")
    step("c_degraded", _config(tmp, "retrain.rm_data=new_only", "retrain.rm_init=sft"))
    print("retrain wall s:", {k: round(v, 1) for k, v in wall.items()})
    return out, client


def test_a_first_retrain_bootstraps_a_champion(sequence):
    out, client = sequence
    assert out["a_bootstrap"]["status"] == "bootstrapped"
    champ = out["a_bootstrap/champion"]
    assert champ is not None and champ.tags["rlhf.started_from"] == "none"
    assert champ.tags["rlhf.parent_run_id"] == out["a_bootstrap"]["parent_run_id"]


def test_d_no_new_batch_trains_nothing(sequence):
    out, _ = sequence
    assert out["d_nothing_new"]["status"] == "nothing new"
    assert out["d_nothing_new/parents"] == out["a_bootstrap/parents"]
    assert out["d_nothing_new/champion"].version == out["a_bootstrap/champion"].version


def test_e_malformed_batch_fails_at_validate_unconsumed_champion_untouched(sequence):
    out, client = sequence
    assert isinstance(out["e_malformed"], ValidationFailed)
    # the gate's rows count in the combined file; the error also names the batch file
    assert "= batch-bad.jsonl rows 1-2" in str(out["e_malformed"])
    assert out["bad_digest"] not in out["e_malformed/consumed"]
    assert out["e_malformed/champion"].version == out["a_bootstrap/champion"].version
    failed = [r for r in _retrain_parents(client) if r.info.status == "FAILED"]
    assert len(failed) == 1
    children = client.search_runs([failed[0].info.experiment_id], filter_string=(
        f"tags.`mlflow.parentRunId` = '{failed[0].info.run_id}'"))
    assert sorted(r.data.tags["rlhf.stage"] for r in children) == ["validate"]
    docs = [a.path for a in client.list_artifacts(children[0].info.run_id, "data_docs")]
    assert "data_docs/index.html" in docs


def test_b_good_batch_moves_champion_with_lineage(sequence):
    out, client = sequence
    res = out["b_good"]
    assert res["status"] == "promoted", res
    new, old = out["b_good/champion"], out["a_bootstrap/champion"]
    assert int(new.version) > int(old.version)
    assert alias_version(client, POLICY, PREVIOUS).version == old.version
    assert json.loads(new.tags["rlhf.batches"]) == [out["good_digest"]]
    assert new.tags["rlhf.started_from"] == f"champion v{old.version}"
    parent = client.get_run(res["parent_run_id"])
    assert parent.data.tags["rlhf.gate.decision"] == "promote"
    assert float(parent.data.tags["rlhf.gate.ci_low"]) > 0
    inputs = {d.dataset.digest for d in parent.inputs.dataset_inputs}
    assert out["good_digest"] in inputs
    # the retrain's parent run lists its registered versions; the UI opens on the runs table
    assert (POLICY, str(new.version)) in registered_models_panel(client, parent.info.run_id)
    exp = client.get_experiment(parent.info.experiment_id)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"


def test_g_second_retrain_while_one_runs_trains_nothing(sequence):
    out, _ = sequence
    assert out["g_overlap"] == {"status": "skipped"}
    assert out["g_overlap/parents"] == out["b_good/parents"]


def test_c_degraded_batch_keeps_champion_and_says_why(sequence):
    out, client = sequence
    res = out["c_degraded"]
    assert res["status"] == "kept", res
    assert out["c_degraded/champion"].version == out["b_good/champion"].version
    parent = client.get_run(res["parent_run_id"])
    tags = parent.data.tags
    assert tags["rlhf.gate.decision"] == "keep" and "CI" in tags["rlhf.gate.reason"]
    assert float(tags["rlhf.gate.ci_low"]) <= 1.5 and "margin 1.5" in tags["rlhf.gate.reason"]
    challenger = client.get_model_version_by_alias(POLICY, "challenger")
    assert challenger.tags["rlhf.gate"] == tags["rlhf.gate.reason"]
