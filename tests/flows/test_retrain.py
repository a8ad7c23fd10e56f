"""The retrain cases through a served `retrain/<name>` deployment: a real `prefect server
start` and a real `rlhf serve` as subprocesses, each case triggered through the Prefect API
(what the UI calls) and its outcome read only from the Prefect API (state, state message,
artifacts) and the MLflow store (aliases, tags, runs).

One module-scoped sequence (each step needs the registry the previous left):
(a) no champion -> bootstrap; (d) no new batch -> nothing trained; (e) malformed batch ->
fails at validate, unconsumed, champion untouched; (b) good batch -> champion moves;
(g) another retrain holds the slot -> skipped, nothing trained; (c) degraded batch -> kept,
reason recorded (a custom run changing two `retrain` fields of the served config).

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

import pytest
from mlflow.tracking import MlflowClient

from flows.config import load_config
from rlhf_core.demo import write_preference_batch
from tasks.registry import CHAMPION, PREVIOUS, alias_version
from tasks.retrain import consumed_digests, file_digest
from tests.flows.prefect_procs import (
    ROOT,
    prefect_server,
    rlhf_serve,
    wait_deployment,
    wait_run,
)
from tests.shared import registered_models_panel

CONFIG = ROOT / "configs" / "test.yaml"
POLICY = "rlhf-policy"
DEGRADED = {"config": {"retrain": {"rm_data": "new_only", "rm_init": "sft"}}}


def _sets(tmp) -> list[str]:
    return [f"tracking.tracking_uri=sqlite:///{tmp}/mlflow.db", f"tracking.workdir={tmp}/runs",
            "tracking.system_metrics=false", f"retrain.watch_dir={tmp}/batches",
            "demo.n_eval=200", "retrain.gate.num_prompts=200", "ppo.iterations=1",
            "retrain.ppo_iterations=10", "retrain.gate.margin=1.5"]


def _retrain_parents(client: MlflowClient) -> list:
    exp = client.get_experiment_by_name("rlhf-test")
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`rlhf.retrain` = 'true'")
    return [r for r in runs if "mlflow.parentRunId" not in r.data.tags]


def _parent_of(client: MlflowClient, flow_run_id) -> str | None:
    """The MLflow parent run the Prefect flow run made (tag rlhf.prefect_flow_run_id)."""
    exp = client.get_experiment_by_name("rlhf-test")
    runs = client.search_runs([exp.experiment_id], filter_string=(
        f"tags.`rlhf.prefect_flow_run_id` = '{flow_run_id}'"))
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) <= 1, parents
    return parents[0].info.run_id if parents else None


def _decision(client, flow_run_id) -> str:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    arts = client.read_artifacts(artifact_filter=ArtifactFilter(
        flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    return "\n".join(str(a.data) for a in arts if a.key == "rlhf-retrain-decision")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from prefect.client.orchestration import SyncPrefectClient

    tmp = tmp_path_factory.mktemp("retrain")
    args = ["--config", str(CONFIG), "--name", "cases"]
    for item in _sets(tmp):
        args += ["--set", item]
    with prefect_server(tmp / "server") as (api, env):
        with rlhf_serve(env, tmp, args) as (proc, log), SyncPrefectClient(api) as client:
            deployment = wait_deployment(client, "retrain/cases", proc, log)
            yield {"client": client, "deployment": deployment, "api": api, "log": log,
                   "tmp": tmp, "cfg": load_config(CONFIG, _sets(tmp))}


@pytest.fixture(scope="module")
def sequence(served):
    from prefect.concurrency.sync import concurrency
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.retrain import limit_name

    prefect, tmp, cfg = served["client"], served["tmp"], served["cfg"]
    client = MlflowClient(cfg.tracking.tracking_uri)
    batches = tmp / "batches"
    out, wall = {}, {}

    def step(name, parameters=None):
        start = time.perf_counter()
        run = prefect.create_flow_run_from_deployment(served["deployment"].id,
                                                      parameters=parameters or {})
        run = wait_run(prefect, run.id, timeout=600)
        wall[name] = time.perf_counter() - start
        out[name] = {"state": run.state.type.value, "message": run.state.message or "",
                     "decision": _decision(prefect, run.id),
                     "parent_run_id": _parent_of(client, run.id)}
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
    write_preference_batch(batches, 2000, seed=12, degraded=True)
    # another retrain holds the slot (taken through the server's concurrency API)
    with temporary_settings({PREFECT_API_URL: served["api"]}):
        with concurrency(limit_name(cfg), occupy=1, strict=True):
            step("g_overlap")
    step("c_degraded", DEGRADED)  # a custom run: two fields, the rest stay served
    print("retrain wall s:", {k: round(v, 1) for k, v in wall.items()})
    return out, client


def _ok(out, name, served) -> dict:
    res = out[name]
    assert res["state"] == "COMPLETED", (res, served["log"].read_text()[-3000:])
    return res


def test_a_first_retrain_bootstraps_a_champion(sequence, served):
    out, client = sequence
    res = _ok(out, "a_bootstrap", served)
    assert "first champion" in res["decision"]
    champ = out["a_bootstrap/champion"]
    assert champ is not None and champ.tags["rlhf.started_from"] == "none"
    assert res["parent_run_id"] and champ.tags["rlhf.parent_run_id"] == res["parent_run_id"]


def test_d_no_new_batch_trains_nothing(sequence, served):
    out, _ = sequence
    res = _ok(out, "d_nothing_new", served)
    assert "nothing new" in res["decision"] and res["parent_run_id"] is None
    assert out["d_nothing_new/parents"] == out["a_bootstrap/parents"]
    assert out["d_nothing_new/champion"].version == out["a_bootstrap/champion"].version


def test_e_malformed_batch_fails_at_validate_unconsumed_champion_untouched(sequence):
    out, client = sequence
    res = out["e_malformed"]
    assert res["state"] == "FAILED" and "ValidationFailed" in res["message"], res
    # the gate's rows count in the combined file; the error also names the batch file
    assert "= batch-bad.jsonl rows 1-2" in res["message"]
    assert out["bad_digest"] not in out["e_malformed/consumed"]
    assert out["e_malformed/champion"].version == out["a_bootstrap/champion"].version
    failed = client.get_run(res["parent_run_id"])
    assert failed.info.status == "FAILED"
    assert [r.info.run_id for r in _retrain_parents(client)
            if r.info.status == "FAILED"] == [failed.info.run_id]
    children = client.search_runs([failed.info.experiment_id], filter_string=(
        f"tags.`mlflow.parentRunId` = '{failed.info.run_id}'"))
    assert sorted(r.data.tags["rlhf.stage"] for r in children) == ["validate"]
    docs = [a.path for a in client.list_artifacts(children[0].info.run_id, "data_docs")]
    assert "data_docs/index.html" in docs


def test_b_good_batch_moves_champion_with_lineage(sequence, served):
    out, client = sequence
    res = _ok(out, "b_good", served)
    new, old = out["b_good/champion"], out["a_bootstrap/champion"]
    assert int(new.version) > int(old.version), res
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


def test_g_second_retrain_while_one_runs_trains_nothing(sequence, served):
    out, _ = sequence
    res = _ok(out, "g_overlap", served)
    assert "skipped" in res["decision"] and res["parent_run_id"] is None
    assert out["g_overlap/parents"] == out["b_good/parents"]


def test_c_degraded_batch_keeps_champion_and_says_why(sequence, served):
    out, client = sequence
    res = _ok(out, "c_degraded", served)
    assert out["c_degraded/champion"].version == out["b_good/champion"].version
    parent = client.get_run(res["parent_run_id"])
    tags = parent.data.tags
    # the custom run's two fields took effect; the served margin stayed
    assert parent.data.params["retrain.rm_data"] == "new_only", parent.data.params
    assert tags["rlhf.gate.decision"] == "keep" and "CI" in tags["rlhf.gate.reason"]
    assert float(tags["rlhf.gate.ci_low"]) <= 1.5 and "margin 1.5" in tags["rlhf.gate.reason"]
    challenger = client.get_model_version_by_alias(POLICY, "challenger")
    assert challenger.tags["rlhf.gate"] == tags["rlhf.gate.reason"]
