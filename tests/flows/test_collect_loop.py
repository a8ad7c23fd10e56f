"""The on-policy loop against a real Prefect server and `rlhf serve`: `rlhf retrain` from the
command line (no server: Prefect's local ephemeral API) bootstraps a deliberately weak
champion (1 PPO iteration); a run of the `collect/test` deployment writes a labelling file;
a second collection repeats none of its prompts; the demo's gold judge labels the first file
and `rlhf label import` brings it in. With a real Label Studio server (its own venv), the
import goes to another Prefect API (the session's test server: no event reaches this one),
and `rlhf demo-batch --via label-studio` collects into a project, annotates it as three demo
accounts (one reversed) and pulls: the pull's `rlhf.preferences.labelled` event starts a run
of the `retrain/test` deployment (no schedule involved), which promotes the challenger; a
second pull imports nothing. Without Label Studio the file import's event starts it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from contextlib import nullcontext

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from tasks.config.pipeline_config import load_config
from tasks.pipeline.judge import gold_judge
from tasks.platform.mlflow.registry import CHAMPION, alias_version
from tasks.retrain.batches import file_digest
from tasks.retrain.labels.client import KEY_VAR, URL_VAR
from tasks.retrain.labels.collect import LABEL_COLUMNS, collect
from tasks.retrain.store import PROMPTS
from tests.flows.prefect_procs import (
    ROOT,
    base_env,
    prefect_server,
    rlhf_serve,
    wait_deployment,
    wait_run,
    with_migrated_db,
)
from tests.labelstudio import label_studio_server
from tests.labelstudio import venv as label_studio_venv
from tests.stores import seed_sqlite_store

SETS = ["tracking.system_metrics=false", "demo.n_eval=200", "retrain.gate.num_prompts=200",
        "ppo.iterations=1", "retrain.ppo_iterations=10", "collect.num_prompts=64"]


def _cli(args: list[str], env: dict, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=600)


def _events(api: str) -> list[dict]:
    body = json.dumps({"filter": {"event": {"prefix": ["rlhf."]}}, "limit": 50}).encode()
    req = urllib.request.Request(f"{api}/events/filter", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())["events"]


def _artifacts(client, flow_run_id) -> dict:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    return {a.key: a.data for a in client.read_artifacts(artifact_filter=ArtifactFilter(
        flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))}


def _triggered_run(client, deployment_id, timeout: float = 120):
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    deadline = time.time() + timeout
    while time.time() < deadline:
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(
            id=DeploymentFilterId(any_=[deployment_id])))
        if runs:
            return runs[0]
        time.sleep(1)
    raise TimeoutError("no retrain flow run started after the import")


@pytest.fixture(scope="module")
def loop(tmp_path_factory, prefect_api):
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.settings import PREFECT_API_URL, temporary_settings

    tmp = tmp_path_factory.mktemp("loop")
    uri = f"sqlite:///{tmp}/mlflow.db"
    sets = [f"tracking.tracking_uri={uri}", f"tracking.workdir={tmp}/runs",
            f"retrain.watch_dir={tmp}/batches", f"collect.out_dir={tmp}/to_label", *SETS]
    cfg = load_config(ROOT / "configs" / "test.yaml", sets)
    args = ["--config", str(ROOT / "configs" / "test.yaml")]
    for item in sets:
        args += ["--set", item]
    out, mlflow = {}, MlflowClient(uri)
    seed_sqlite_store(uri)
    with_migrated_db(tmp / "ephemeral")  # the local ephemeral API's home and database
    # the bootstrap runs while the server and `rlhf serve` start
    bootstrap = subprocess.Popen([sys.executable, "-m", "cli", "retrain", *args],
                                 env=base_env(tmp / "ephemeral"), cwd=tmp, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    studio = label_studio_server(tmp) if (label_studio_venv() / "bin" / "label-studio") \
        .exists() else nullcontext(None)
    with studio as ls, prefect_server(tmp / "server") as (api, env):
        with rlhf_serve(env, tmp, [*args, "--name", "test"]) as (proc, log), \
                SyncPrefectClient(api) as client:
            retrain = wait_deployment(client, "retrain/test", proc, log)
            collect_dep = wait_deployment(client, "collect/test", proc, log)
            stdout, stderr = bootstrap.communicate(timeout=600)
            out["bootstrap"] = subprocess.CompletedProcess([], bootstrap.returncode, stdout,
                                                           stderr)
            run = client.create_flow_run_from_deployment(collect_dep.id)
            out["collect_run"] = wait_run(client, run.id, timeout=300)
            out["collect_artifacts"] = _artifacts(client, run.id)
            first = sorted((tmp / "to_label").glob("*.jsonl"))
            with temporary_settings({PREFECT_API_URL: api}):
                out["second"] = collect.fn(cfg)  # a second collection of the same pool
            table = pd.read_json(first[0], lines=True, dtype=False)
            table["choice"] = gold_judge("demo").label(table.to_dict("records"), seed=0)
            labelled = tmp / "labelled.jsonl"
            table.to_json(labelled, orient="records", lines=True)
            # with Label Studio, the pull below starts the retrain, not this import
            other_api = {**base_env(tmp / "ephemeral"), "PREFECT_API_URL": prefect_api}
            out["import"] = _cli(["label", "import", str(labelled), *args],
                                 other_api if ls else env, tmp)
            if ls is not None:
                ls.accounts([])  # the admin's personal access token
                # INFO: the pull's outcome is a line of the flow run's log
                ls_env = {**env, URL_VAR: ls.url, KEY_VAR: ls.admin_key,
                          "PREFECT_LOGGING_LEVEL": "INFO"}
                out["demo"] = _cli(["demo-batch", "--via", "label-studio", "--seed", "5",
                                    "--n", "32", *args], ls_env, tmp)
            out["retrain_run"] = wait_run(client, _triggered_run(client, retrain.id).id, 600)
            if ls is not None:
                out["pull_again"] = _cli(["label", "pull", *args], ls_env, tmp)
            out.update(first=first[0], table=table, api=api, log=log,
                       retrain=client.read_deployment(retrain.id), events=_events(api))
            deadline = time.time() + 60  # a flow run's process sends its events as it ends
            while time.time() < deadline and "rlhf.champion.promoted" not in \
                    [e["event"] for e in out["events"]]:
                time.sleep(1)
                out["events"] = _events(api)
    out.update(mlflow=mlflow, tmp=tmp)
    return out


def test_rlhf_retrain_from_the_command_line_bootstraps_a_champion(loop):
    res = loop["bootstrap"]
    assert res.returncode == 0, res.stderr[-3000:]
    assert "retrain: bootstrapped" in res.stdout
    assert alias_version(loop["mlflow"], "rlhf-policy", CHAMPION) is not None


def test_collect_deployment_writes_a_labelling_file_recorded_in_mlflow(loop):
    run = loop["collect_run"]
    assert run.state.type.value == "COMPLETED", loop["log"].read_text()[-3000:]
    assert run.name.startswith("collect-rlhf-policy-v1-v1-")
    table = loop["table"]
    assert list(table.columns[:len(LABEL_COLUMNS)]) == list(LABEL_COLUMNS)
    assert (table["policy_version"].astype(str) == "1").all()
    assert not (table["response_a"].str.strip() == table["response_b"].str.strip()).any()
    assert (table["response_a"].str.strip() != "").all()
    shown = json.loads(loop["collect_artifacts"]["rlhf-collection"])  # the first rows
    assert [r["id"] for r in shown] == list(table["id"][:len(shown)]) and len(shown) == 10
    mlflow = loop["mlflow"]
    exp = mlflow.get_experiment_by_name("rlhf-test")
    (rec,) = [r for r in mlflow.search_runs([exp.experiment_id], filter_string=(
        f"tags.`rlhf.collection` = '{loop['first'].stem}'"))]
    assert rec.data.metrics["collect/known"] == 40  # collect.known_pairs
    assert rec.data.metrics["collect/rows"] == len(table)
    (dataset,) = rec.inputs.dataset_inputs
    assert {t.key: t.value for t in dataset.tags}["rlhf.policy_version"] == "rlhf-policy/1"
    # the sampled policy's logged model, beside the file (search_runs leaves models out)
    assert mlflow.get_run(rec.info.run_id).inputs.model_inputs


def test_a_second_collection_repeats_no_prompt(loop):
    mlflow = loop["mlflow"]
    first = set(loop["table"]["prompt"])
    second = json.loads(open(mlflow.download_artifacts(loop["second"].run_id, PROMPTS)).read())
    assert len(second) == 64 and not first & set(second)
    assert loop["second"].counts["pool_used"] == 128


def test_an_import_starts_a_retrain_that_promotes_the_challenger(loop):
    imp = loop["import"]
    assert imp.returncode == 0, imp.stderr[-3000:]
    assert "imported labelled.jsonl" in imp.stdout
    assert not loop["retrain"].schedules  # the event started it, not a schedule
    run = loop["retrain_run"]
    assert run.state.type.value == "COMPLETED", loop["log"].read_text()[-3000:]
    batches = sorted((loop["tmp"] / "batches").glob("labelled-*.jsonl"))
    digests = sorted(file_digest(b) for b in batches)  # what the retrain consumed
    assert len(digests) == (2 if "demo" in loop else 1)
    for batch in batches:  # matched to the lineage by eye
        assert batch.name.startswith(f"labelled-{file_digest(batch)}-from-")
    assert any(run.name.startswith(f"retrain-rlhf-policy-v1-{d[:8]}") for d in digests)
    champion = alias_version(loop["mlflow"], "rlhf-policy", CHAMPION)
    assert str(champion.version) == "2"
    assert sorted(json.loads(champion.tags["rlhf.batches"])) == digests
    # promoted: no longer the challenger
    assert "challenger" not in loop["mlflow"].get_registered_model("rlhf-policy").aliases
    # the retrain's params are the settings its PPO ran with (retrain.ppo_iterations)
    assert loop["mlflow"].get_run(champion.tags["rlhf.parent_run_id"]).data.params[
        "ppo.iterations"] == "10"
    names = [e["event"] for e in loop["events"]]
    # the deployment's collection announces itself (the second, in-process collection's
    # event goes to whichever API this pytest process's event worker first connected to)
    assert "rlhf.collection.ready" in names
    assert "rlhf.preferences.labelled" in names and "rlhf.champion.promoted" in names


def test_a_label_studio_pull_starts_the_retrain_and_a_second_pull_imports_nothing(loop):
    if "demo" not in loop:
        pytest.skip("no Label Studio (make label-studio)")
    demo = loop["demo"]
    assert demo.returncode == 0, demo.stderr[-3000:]
    text = demo.stdout + demo.stderr
    assert "annotated" in text and "judge@rlhf.demo" in text
    assert "pairs labelled" in text and ": imported" in text
    assert "held back, votes dropped: reversed@rlhf.demo" in text
    labelled = [e for e in loop["events"] if e["event"] == "rlhf.preferences.labelled"]
    assert len(labelled) == 1  # the pull's (the file import's went to the local API)
    again = loop["pull_again"]
    assert again.returncode == 0, again.stderr[-3000:]
    assert "every pair was pulled before" in again.stdout + again.stderr
