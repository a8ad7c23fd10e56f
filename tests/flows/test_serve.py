"""`rlhf serve` against a real Prefect server, driven only through the Prefect API (what the
UI calls) and read back only from the Prefect API (states, state messages, artifacts) and the
MLflow store: the stored parameter schema; the retrain deployment's interval schedule starts a
run by itself (f), which bootstraps the first champion (a), while `rlhf retrain` of another
store, on the same Prefect server, bootstraps its own champion beside it, and a retrain of
this store triggered meanwhile is not started (g); then, triggered by hand: (d) no new batch
-> nothing trained; (e) malformed batch -> fails at validate, unconsumed, champion untouched;
(b) good batch -> champion moves; (c) degraded batch (a custom run changing two `retrain`
fields) -> kept, reason recorded; then the pipeline deployment with a one-field override, and
prefect.yaml's deployments on a process worker.

Making (b) and (c) reliable on a tiny model: the bootstrap champion is deliberately weak (1
PPO iteration), so the good batch's 10 iterations win clearly (measured: judge +2.8, 95% CI
[+2.3, +3.3]); the degraded case trains its RM on the reversed batch alone (rm_data new_only,
fresh head on SFT). Part of any PPO gain here is EOS learning (the EOS trick), which a reversed
RM still rewards, so the gate asks for a margin of 1.5 judge points, which the good batch
clears and the degraded one does not (measured: +0.29 to +0.66, CI lower ends -0.12 to +0.26).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from flows.serve import served_parameters
from rlhf_core.demo import write_preference_batch
from tasks.config.pipeline_config import load_config
from tasks.platform.mlflow.registry import CHAMPION, PREVIOUS, alias_version
from tasks.retrain.batches import file_digest
from tasks.retrain.store import consumed_batches
from tests.flows.prefect_procs import (
    ROOT,
    TERMINAL,
    prefect_server,
    rlhf_serve,
    stop,
    wait_deployment,
    wait_run,
)
from tests.servers import stage_children
from tests.shared import pipeline_stages, registered_models_panel

POOL = "rlhf-process"  # prefect.yaml's work pool
SECTIONS = {"model", "data", "sft", "reward", "ppo", "eval", "tracking"}
SCHEDULER = {"PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "2",
             "PREFECT_SERVER_SERVICES_SCHEDULER_MIN_RUNS": "1",
             "PREFECT_SERVER_SERVICES_SCHEDULER_MAX_RUNS": "3"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from prefect.client.orchestration import SyncPrefectClient

    tmp = tmp_path_factory.mktemp("serve")
    uri = f"sqlite:///{tmp}/mlflow.db"
    sets = [f"tracking.tracking_uri={uri}", f"tracking.workdir={tmp}/runs",
            "tracking.system_metrics=false", f"retrain.watch_dir={tmp}/batches",
            "retrain.schedule.interval_s=10", "demo.n_eval=200", "retrain.gate.num_prompts=200",
            "ppo.iterations=1", "retrain.ppo_iterations=10", "retrain.gate.margin=1.5"]
    args = ["--config", str(ROOT / "configs" / "test.yaml"), "--name", "test"]
    for item in sets:
        args += ["--set", item]
    with prefect_server(tmp / "server", SCHEDULER) as (api, env):
        with rlhf_serve(env, tmp, args) as (proc, log), SyncPrefectClient(api) as client:
            pipeline = wait_deployment(client, "rlhf_pipeline/test", proc, log)
            retrain = wait_deployment(client, "retrain/test", proc, log)
            yield {"client": client, "pipeline": pipeline, "retrain": retrain,
                   "mlflow": MlflowClient(uri), "log": log, "env": env, "api": api,
                   "tmp": tmp, "cfg": load_config(ROOT / "configs" / "test.yaml", sets)}


def _runs_of(client, deployment_id):
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    return client.read_flow_runs(deployment_filter=DeploymentFilter(
        id=DeploymentFilterId(any_=[deployment_id])))


def _decision(client, flow_run_id) -> str:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    arts = client.read_artifacts(artifact_filter=ArtifactFilter(
        flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    return "\n".join(str(a.data) for a in arts if a.key == "rlhf-retrain-decision")


def test_parameter_schema_has_typed_sections_with_descriptions(served):
    deployment = served["pipeline"]
    schema = deployment.parameter_openapi_schema
    props, defs = schema["properties"], schema["definitions"]
    assert SECTIONS <= set(props)
    assert props["ppo"]["$ref"] == "#/definitions/PPOConfig"
    assert props["ppo"]["description"].startswith("PPO")
    kl = defs["PPOConfig"]["properties"]["kl_coef"]
    assert kl["type"] == "number" and "KL" in kl["description"]
    # the form starts from the served config (demo on), not a bare config's defaults
    assert deployment.parameters["demo"]["enabled"] is True
    assert deployment.parameters["ppo"]["iterations"] == 1


def test_schedule_starts_a_retrain_and_a_second_one_does_not_train(served):
    from tasks.retrain.round import limit_name  # one slot per store and policy

    client, deployment = served["client"], served["retrain"]
    deadline, first = time.time() + 240, None
    while time.time() < deadline and first is None:  # (f) nobody triggers this one
        running = [r for r in _runs_of(client, deployment.id)
                   if r.state and r.state.type.value == "RUNNING"]
        limit = client.read_global_concurrency_limit_by_name(limit_name(served["cfg"]))
        first = running[0] if running and limit.active_slots else None
        time.sleep(0.5)
    assert first is not None, served["log"].read_text()[-3000:]
    assert "auto-scheduled" in first.tags
    (other := served["tmp"] / "other").mkdir()  # another store retrains beside this one
    sets = [f"tracking.tracking_uri=sqlite:///{other}/mlflow.db", "ppo.iterations=1",
            f"tracking.workdir={other}/runs", f"retrain.watch_dir={other}/batches",
            "tracking.system_metrics=false", "demo.n_eval=200", "retrain.gate.num_prompts=200"]
    beside = subprocess.Popen([sys.executable, "-m", "cli", "retrain", "--config", str(
        ROOT / "configs" / "test.yaml"), *[a for x in sets for a in ("--set", x)]], text=True,
        env=served["env"], cwd=other, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    second = client.create_flow_run_from_deployment(deployment.id)  # (g) while it trains
    second = wait_run(client, second.id, timeout=240)
    # the deployment's concurrency limit cancels it before it starts (recorded as its
    # state); had it started, the flow's own slot would have skipped it, or, once the first
    # had finished, it found nothing new; it never trains (one retrain run below)
    if second.state.type.value == "CANCELLED":
        assert "concurrency" in (second.state.message or "").lower(), second.state
    else:
        decision = _decision(client, second.id)
        assert second.state.type.value == "COMPLETED", second.state
        assert "skipped" in decision or "nothing new" in decision, decision
    first = wait_run(client, first.id, timeout=300)
    assert first.state.type.value == "COMPLETED", served["log"].read_text()[-3000:]
    assert "first champion" in _decision(client, first.id)
    out = beside.communicate(timeout=600)[0]  # its own slot: it trained, not skipped
    assert beside.returncode == 0 and "retrain: bootstrapped" in out, out[-3000:]
    other_store = MlflowClient(f"sqlite:///{other}/mlflow.db")
    assert int(other_store.get_model_version_by_alias(POLICY, CHAMPION).version) == 1
    client.pause_deployment(deployment.id)  # no more scheduled runs while the rest runs
    assert deployment.global_concurrency_limit.limit == 1
    assert deployment.concurrency_options.collision_strategy.value == "CANCEL_NEW"
    retrains = served["mlflow"].search_runs(
        [e.experiment_id for e in served["mlflow"].search_experiments()],
        filter_string="tags.`rlhf.retrain` = 'true'")
    assert len([r for r in retrains if "mlflow.parentRunId" not in r.data.tags]) == 1


POLICY = "rlhf-policy"
DEGRADED = {"config": {"retrain": {"rm_data": "new_only", "rm_init": "sft"}}}


def _retrain_parents(mlflow: MlflowClient) -> list:
    exp = mlflow.get_experiment_by_name("rlhf-test")
    runs = mlflow.search_runs([exp.experiment_id], filter_string="tags.`rlhf.retrain` = 'true'")
    return [r for r in runs if "mlflow.parentRunId" not in r.data.tags]


def _parent_run(mlflow: MlflowClient, flow_run_id):
    """The MLflow parent run a Prefect flow run made (tag rlhf.prefect_flow_run_id), or None."""
    runs = [r for r in mlflow.search_runs(
        [e.experiment_id for e in mlflow.search_experiments()],
        filter_string=f"tags.`rlhf.prefect_flow_run_id` = '{flow_run_id}'")
        if "mlflow.parentRunId" not in r.data.tags]
    assert len(runs) <= 1, runs
    return runs[0] if runs else None


def _write_bad_batch(batches) -> str:
    bad = batches / "batch-bad.jsonl"
    bad.write_text(json.dumps({"prompt": "user : describe cats assistant :", "chosen": "x",
                               "rejected": "x"}) + "\n"
                   + json.dumps({"prompt": "", "chosen": "a", "rejected": "b"}) + "\n")
    return file_digest(bad)


@pytest.fixture(scope="module")
def retrain_cases(served):
    """(a) from the scheduled run, then (d), (e), (b), (c) triggered by hand, in order (each
    needs the registry the previous left); outcomes read from Prefect and MLflow only."""
    client, deployment, mlflow = served["client"], served["retrain"], served["mlflow"]
    client.pause_deployment(deployment.id)  # no scheduled run between the cases
    for run in _runs_of(client, deployment.id):  # one may have started before the pause
        if run.state and run.state.type.value not in TERMINAL:
            wait_run(client, run.id, timeout=600)
    out, wall, batches = {}, {}, served["tmp"] / "batches"

    def record(name, run):
        parent = _parent_run(mlflow, run.id)
        out[name] = {"state": run.state.type.value, "message": run.state.message or "",
                     "decision": _decision(client, run.id),
                     "parent_run_id": parent.info.run_id if parent else None}
        out[f"{name}/champion"] = alias_version(mlflow, POLICY, CHAMPION)
        out[f"{name}/parents"] = len(_retrain_parents(mlflow))

    def step(name, parameters=None):
        start = time.perf_counter()
        run = client.create_flow_run_from_deployment(deployment.id, parameters=parameters or {})
        record(name, wait_run(client, run.id, timeout=600))
        wall[name] = time.perf_counter() - start

    firsts = [r for r in _runs_of(client, deployment.id)
              if "first champion" in _decision(client, r.id)]
    if firsts:  # (a) the scheduled run bootstrapped the champion
        record("a_bootstrap", firsts[0])
    else:  # this test alone (-k): bootstrap by hand
        step("a_bootstrap")
    step("d_nothing_new")
    batches.mkdir(parents=True, exist_ok=True)
    out["bad_digest"] = _write_bad_batch(batches)
    step("e_malformed")
    out["e_malformed/consumed"] = set(consumed_batches(served["cfg"]))
    # the refused batch left the watch folder for quarantine/, so later rounds go on
    out["e_malformed/moved"] = not (batches / "batch-bad.jsonl").exists() and \
        (batches / "quarantine" / "batch-bad.jsonl").exists()
    out["good_digest"] = file_digest(write_preference_batch(batches, 256, seed=11))
    step("b_good")
    write_preference_batch(batches, 2000, seed=12, degraded=True)
    step("c_degraded", DEGRADED)  # a custom run: two fields, the rest stay served
    print("retrain case wall s:", {k: round(v, 1) for k, v in wall.items()})
    return out


def _ok(out, name, served) -> dict:
    assert out[name]["state"] == "COMPLETED", (out[name], served["log"].read_text()[-3000:])
    return out[name]


def test_a_first_retrain_bootstraps_a_champion(served, retrain_cases):
    res, champ = _ok(retrain_cases, "a_bootstrap", served), retrain_cases["a_bootstrap/champion"]
    assert champ is not None and champ.tags["rlhf.started_from"] == "none"
    assert res["parent_run_id"] and champ.tags["rlhf.parent_run_id"] == res["parent_run_id"]


def test_d_no_new_batch_trains_nothing(served, retrain_cases):
    out = retrain_cases
    res = _ok(out, "d_nothing_new", served)
    assert "nothing new" in res["decision"] and res["parent_run_id"] is None
    assert out["d_nothing_new/parents"] == out["a_bootstrap/parents"]
    assert out["d_nothing_new/champion"].version == out["a_bootstrap/champion"].version


def test_e_malformed_batch_fails_at_validate_unconsumed_champion_untouched(served,
                                                                           retrain_cases):
    out, mlflow = retrain_cases, served["mlflow"]
    res = out["e_malformed"]
    assert res["state"] == "FAILED" and "ValidationFailed" in res["message"], res
    # the gate's rows count in the combined file; the error also names the batch file
    assert "= batch-bad.jsonl rows 1-2" in res["message"]
    assert out["bad_digest"] not in out["e_malformed/consumed"]
    assert out["e_malformed/moved"] and "quarantined:" in res["message"]
    assert out["e_malformed/champion"].version == out["a_bootstrap/champion"].version
    failed = mlflow.get_run(res["parent_run_id"])
    assert [r.info.run_id for r in _retrain_parents(mlflow)
            if r.info.status == "FAILED"] == [failed.info.run_id]
    children = mlflow.search_runs([failed.info.experiment_id], filter_string=(
        f"tags.`mlflow.parentRunId` = '{failed.info.run_id}'"))
    assert sorted(r.data.tags["rlhf.stage"] for r in children) == ["validate"]
    docs = [a.path for a in mlflow.list_artifacts(children[0].info.run_id, "data_docs")]
    assert "data_docs/index.html" in docs


def test_b_good_batch_moves_champion_with_lineage(served, retrain_cases):
    out, mlflow = retrain_cases, served["mlflow"]
    res = _ok(out, "b_good", served)
    new, old = out["b_good/champion"], out["a_bootstrap/champion"]
    assert int(new.version) > int(old.version), res
    assert alias_version(mlflow, POLICY, PREVIOUS).version == old.version
    assert json.loads(new.tags["rlhf.batches"]) == [out["good_digest"]]
    assert new.tags["rlhf.started_from"] == f"champion v{old.version}"
    parent = mlflow.get_run(res["parent_run_id"])
    assert parent.data.tags["rlhf.gate.decision"] == "promote"
    assert float(parent.data.tags["rlhf.gate.ci_low"]) > 0
    assert out["good_digest"] in {d.dataset.digest for d in parent.inputs.dataset_inputs}
    # the retrain's parent run lists its registered versions; the UI opens on the runs table
    assert (POLICY, str(new.version)) in registered_models_panel(mlflow, parent.info.run_id)
    exp = mlflow.get_experiment(parent.info.experiment_id)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"


def test_c_degraded_batch_keeps_champion_and_says_why(served, retrain_cases):
    out, mlflow = retrain_cases, served["mlflow"]
    res = _ok(out, "c_degraded", served)
    assert out["c_degraded/champion"].version == out["b_good/champion"].version
    parent = mlflow.get_run(res["parent_run_id"])
    tags = parent.data.tags
    # the custom run's two fields took effect; the served margin stayed
    assert parent.data.params["retrain.rm_data"] == "new_only"
    assert parent.data.params["retrain.rm_init"] == "sft"
    assert tags["rlhf.gate.decision"] == "keep" and "CI" in tags["rlhf.gate.reason"]
    assert float(tags["rlhf.gate.ci_low"]) <= 1.5 and "margin 1.5" in tags["rlhf.gate.reason"]
    challenger = mlflow.get_model_version_by_alias(POLICY, "challenger")
    assert challenger.tags["rlhf.gate"] == tags["rlhf.gate.reason"]


def test_one_field_override_keeps_the_served_config_for_the_rest(served):
    """A pipeline run from the deployment with one field changed: that field is the run's, all
    others are the served config's (demo on, 1 PPO iteration), not a bare config's defaults
    (a run with no parameters at all: the retrain runs above)."""
    client, deployment = served["client"], served["pipeline"]
    run = wait_run(client, client.create_flow_run_from_deployment(
        deployment.id, parameters={"ppo": {"kl_coef": 0.123}}).id)
    assert run.state.type.value == "COMPLETED", served["log"].read_text()[-3000:]
    parent = _parent_run(served["mlflow"], run.id)
    params = parent.data.params
    assert params["ppo.kl_coef"] == "0.123" and params["ppo.rollout_batch_size"] == "16"
    assert params["demo.enabled"] == "True" and params["ppo.iterations"] == "1"
    name = run.name  # named as a CLI run is, plus what the form changed; MLflow's the same
    assert re.fullmatch(r"\d{8}-\d{6}-demo-gpt2-demo-data-\w{6} kl_coef=0\.123", name), name
    assert parent.info.run_name == name


@pytest.fixture(scope="module")
def yaml_deployed(served):
    """prefect.yaml's deployments on the served Prefect server, in a process work pool."""
    prefect = [sys.executable, "-m", "prefect"]
    subprocess.run([*prefect, "work-pool", "create", POOL, "--type", "process"],
                   env=served["env"], cwd=ROOT, check=True, capture_output=True, timeout=120)
    for _attempt in range(3):
        out = subprocess.run([*prefect, "--no-prompt", "deploy", "--all"], env=served["env"],
                             cwd=ROOT, capture_output=True, text=True, timeout=300)
        # a SQLite Prefect server under load can answer 503 (database busy) past the
        # client's own retries; `prefect deploy` upserts, so running it again is safe
        if out.returncode == 0 or "503 Service Unavailable" not in out.stdout + out.stderr:
            break
        time.sleep(5)
    server_log = served["tmp"] / "server" / "server.log"
    assert out.returncode == 0, (out.stdout[-3000:] + out.stderr[-3000:]
                                 + server_log.read_text()[-3000:])
    return served["client"].read_deployment_by_name("rlhf_pipeline/demo")


def test_prefect_deploy_registers_the_prefect_yaml_deployments(served, yaml_deployed):
    client, pipeline = served["client"], yaml_deployed
    assert pipeline.work_pool_name == POOL
    assert pipeline.parameters["demo"]["enabled"] is True
    assert "PPOConfig" in pipeline.parameter_openapi_schema["definitions"]
    assert client.read_deployment_by_name("retrain/demo").work_pool_name == POOL
    stage = client.read_deployment_by_name("rlhf-stage/gpu")  # routed stages' queue
    assert (stage.work_pool_name, stage.work_queue_name) == (POOL, "gpu")
    # the checkout is found on the worker at run time, not where `prefect deploy` ran
    assert pipeline.pull_steps == [{"prefect.deployments.steps.set_working_directory": {
        "directory": "{{ $RLHF_REPO_DIR }}"}}]


def test_process_worker_runs_the_prefect_yaml_pipeline(served, yaml_deployed, tmp_path):
    """`prefect worker start --pool` (another folder, as on another machine) picks up a run
    of prefect.yaml's pipeline deployment, triggered through the API with the test config's
    sizes and a tracking store of its own, and the run lands in that store. The run routes
    its reward model to prefect.yaml's rlhf-stage/gpu deployment, which a second worker,
    polling only the pool's `gpu` queue (the GPU box), runs."""
    client, store = served["client"], tmp_path / "store"
    uri = f"sqlite:///{store}/mlflow.db"
    small = load_config(ROOT / "configs" / "test.yaml", [
        f"tracking.tracking_uri={uri}", f"tracking.workdir={store}/runs",
        "tracking.system_metrics=false", "tracking.experiment=rlhf-worker",
        "routing.stages.reward_model=rlhf-stage/gpu"])
    log, gpu_log = tmp_path / "worker.log", tmp_path / "gpu_worker.log"
    env = {**served["env"], "RLHF_REPO_DIR": str(ROOT), "PREFECT_WORKER_QUERY_SECONDS": "1",
           "PREFECT_WORKER_PREFETCH_SECONDS": "1"}
    with open(log, "w") as out:
        worker = subprocess.Popen([sys.executable, "-m", "prefect", "worker", "start",
                                   "--pool", POOL, "--limit", "1"], env=env, cwd=tmp_path,
                                  stdout=out, stderr=subprocess.STDOUT)
    (tmp_path / "gpu_box").mkdir()
    with open(gpu_log, "w") as out:
        gpu_worker = subprocess.Popen([sys.executable, "-m", "prefect", "worker", "start",
                                       "--pool", POOL, "--work-queue", "gpu"], env=env,
                                      cwd=tmp_path / "gpu_box", stdout=out,
                                      stderr=subprocess.STDOUT)
    try:
        run = client.create_flow_run_from_deployment(yaml_deployed.id,
                                                     parameters=served_parameters(small))
        run = wait_run(client, run.id, timeout=300)
    finally:
        stop(worker)
        stop(gpu_worker)
    assert run.state.type.value == "COMPLETED", \
        log.read_text()[-3000:] + gpu_log.read_text()[-3000:]
    mlflow = MlflowClient(uri)
    exp = mlflow.get_experiment_by_name("rlhf-worker")
    parents = mlflow.search_runs([exp.experiment_id],
                                 filter_string=f"tags.`rlhf.prefect_flow_run_id` = '{run.id}'")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert parents[0].data.params["ppo.iterations"] == "3"  # the override, not the demo's 60
    stages = stage_children(mlflow, parents[0])
    assert sorted(stages) == sorted(pipeline_stages())
    assert all(r.info.status == "FINISHED" for r in stages.values())
    assert stages["reward_model"].data.tags["rlhf.routed.flow_run"].startswith(
        "rlhf-stage/gpu ")  # taken by the gpu-queue worker
    champion = mlflow.get_model_version_by_alias("rlhf-policy", "champion")
    assert champion.run_id == stages["register"].info.run_id
