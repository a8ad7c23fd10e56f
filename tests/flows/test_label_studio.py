"""Collections in a real Label Studio server (its own venv, SQLite, 127.0.0.1, ended by PID):
the pairs go to a project as tasks that show texts and an opaque reference only; labeller
accounts annotate through the API with their own personal access tokens; `label pull`
imports each pair exactly once (also when a pull is stopped midway and repeated), waits for
``min_labelled``, counts late annotations, and every fault ends in one sentence.

The collections here are records written straight to MLflow (no model is sampled); the
end-to-end loop with a trained champion, `rlhf serve` and the retrain the pull's event
starts is in tests/flows/test_collect_loop.py.
"""

from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tasks.config.pipeline_config import load_config
from tasks.platform.mlflow.tags import COLLECTION_LABEL_STUDIO_TAG, COLLECTION_TAG
from tasks.retrain.labels import imports as labels
from tasks.retrain.labels import pull
from tasks.retrain.labels.client import KEY_VAR, URL_VAR, LabelStudio, LabelStudioError
from tasks.retrain.labels.collect import experiment_for
from tasks.retrain.labels.studio import refuse_studio_rows, send
from tasks.retrain.store import LINK, RECORD
from tests.labelstudio import label_studio_server
from tests.shared import TEST_CONFIG

N_PAIRS, N_KNOWN = 60, 30
GOOD, SECOND, REVERSED = "good@rlhf.test", "second@rlhf.test", "reversed@rlhf.test"


@pytest.fixture(scope="module")
def studio(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("studio")
    with label_studio_server(tmp) as server:
        keys = server.accounts([GOOD, SECOND, REVERSED])
        uri = f"sqlite:///{tmp}/mlflow.db"
        yield {"server": server, "keys": keys, "uri": uri, "client": MlflowClient(uri),
               "tmp": tmp}


@pytest.fixture()
def env(studio, monkeypatch, tmp_path):
    server = studio["server"]
    monkeypatch.setenv(URL_VAR, server.url)
    monkeypatch.setenv(KEY_VAR, server.admin_key)
    events = []
    monkeypatch.setattr(labels, "emit", lambda *a, **k: events.append(a))
    cfg = load_config(TEST_CONFIG, [
        f"tracking.tracking_uri={studio['uri']}", f"retrain.watch_dir={tmp_path}/watch",
        f"collect.out_dir={tmp_path}/to_label", "collect.destination.kind=label_studio",
        f"collect.destination.project=pairs {uuid.uuid4().hex[:6]}",
        "collect.destination.annotations_per_task=3"])
    return {**studio, "cfg": cfg, "events": events, "watch": tmp_path / "watch"}


def truth(i: int) -> str:
    return "a" if i % 3 else "b"


def collection(env, n: int = N_PAIRS, known: int = N_KNOWN):
    """A finished collection run with its record (known answers first) sent to Label
    Studio -> (collection id, record, link)."""
    client, cfg = env["client"], env["cfg"]
    cid = f"v1-{uuid.uuid4().hex[:8]}"
    record = [{"id": f"{cid}-{i:04d}", "prompt": f"prompt {i}", "response_a": f"answer a{i}",
               "response_b": f"answer b{i}", "known": truth(i) if i < known else None,
               "rm_a": float(i % 2), "rm_b": 0.5} for i in range(n)]
    run = client.create_run(experiment_for(client, cfg), tags={COLLECTION_TAG: cid})
    client.log_dict(run.info.run_id, record, RECORD)
    link = send(cfg, client, run.info.run_id, cid, record)
    client.set_terminated(run.info.run_id)
    return cid, record, link


def annotate(env, link, who: str, choose, tasks=None) -> None:
    """The account ``who`` labels the tasks through the API with its own key (a few
    requests at once, as several browser tabs would)."""
    ls = LabelStudio(env["server"].url, env["keys"][who])
    ls.whoami()  # the access token, once

    def one(item) -> None:
        task_id, pair_id = item
        i = int(pair_id.rsplit("-", 1)[1])
        value = {"a": "A", "b": "B", "tie": "Tie", "skip": "Skip"}.get(choose(i), choose(i))
        ls.call("POST", f"/api/tasks/{task_id}/annotations/", {"result": [
            {"from_name": "choice", "to_name": "prompt", "type": "choices",
             "value": {"choices": [value]}}]})

    items = [(t, p) for t, p in sorted(link.tasks.items()) if tasks is None or t in tasks]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, items))


def reverse(i: int) -> str:
    return {"a": "b", "b": "a"}[truth(i)]


def test_tasks_hold_texts_and_an_opaque_reference_and_mlflow_the_link(env):
    cid, record, link = collection(env, n=6, known=2)
    admin = LabelStudio(env["server"].url, env["server"].admin_key)
    for task_id, pair_id in link.tasks.items():
        data = admin.call("GET", f"/api/tasks/{task_id}/")["data"]
        assert set(data) == {"prompt", "response_a", "response_b", "ref"}
        assert cid not in json.dumps(data) and "v1" not in data["ref"]
        i = int(pair_id.rsplit("-", 1)[1])
        assert data["prompt"] == [{"role": "user", "content": f"prompt {i}"}]
        assert data["response_a"] == f"answer a{i}"
    run = env["client"].search_runs([experiment_for(env["client"], env["cfg"])],
                                    filter_string=f"tags.`{COLLECTION_TAG}` = '{cid}'")[0]
    page = run.data.tags[COLLECTION_LABEL_STUDIO_TAG]
    assert page == f"{env['server'].url}/projects/{link.project_id}/data"
    stored = json.loads(Path(env["client"].download_artifacts(run.info.run_id, LINK))
                        .read_text())
    assert sorted(stored["tasks"].values()) == sorted(r["id"] for r in record)
    key = env["server"].admin_key
    assert key not in json.dumps(stored) and key not in json.dumps(run.data.tags)
    assert key not in json.dumps(run.data.params)


def test_a_pull_waits_for_min_labelled_then_imports_each_pair_once(env):
    cid, record, link = collection(env)
    half = set(sorted(link.tasks)[: N_PAIRS // 2])
    for who in (GOOD, SECOND, REVERSED):
        annotate(env, link, who, reverse if who == REVERSED else truth, half)
    (waiting,) = pull.pull(env["cfg"], cid)
    assert waiting.status == "waiting" and waiting.labelled == N_PAIRS // 2
    assert "--partial" in waiting.text() and not env["events"]
    rest = set(link.tasks) - half
    for who in (GOOD, SECOND, REVERSED):
        annotate(env, link, who, reverse if who == REVERSED else truth, rest)
    start = time.perf_counter()
    (first,) = pull.pull(env["cfg"], cid)
    wall = time.perf_counter() - start
    assert first.status == "imported", first.text()
    assert first.new_pairs == N_PAIRS and first.labelled == N_PAIRS and wall < 60
    rows = [json.loads(x) for x in Path(first.file).read_text().splitlines()]
    assert len(rows) == 3 * N_PAIRS and {r["labeller"] for r in rows} == {GOOD, SECOND,
                                                                          REVERSED}
    batch = [json.loads(x) for x in Path(first.imported.batch).read_text().splitlines()]
    assert len(batch) == N_PAIRS - N_KNOWN  # known answers never train
    by_prompt = {r["prompt"]: r["chosen"] for r in batch}
    assert all(by_prompt[f"prompt {i}"] == f"answer {truth(i)}{i}"
               for i in range(N_KNOWN, N_PAIRS))
    # the reversed labeller's votes are dropped and named; the others' train
    assert list(first.imported.held_back) == [REVERSED]
    assert f"held back, votes dropped: {REVERSED}" in first.text()
    (event, *_), = env["events"]
    assert event == "rlhf.preferences.labelled"
    run = env["client"].get_run(first.imported.run_id)
    assert run.data.tags["rlhf.labels.source"] == "label-studio"
    # a late annotation and a second pull: nothing imported again
    annotate(env, link, GOOD, lambda i: "tie", {sorted(link.tasks)[0]})
    (second,) = pull.pull(env["cfg"], cid)
    assert second.status == "done" and len(env["events"]) == 1
    assert len(list(env["watch"].glob("labelled-*.jsonl"))) == 1
    desc = LabelStudio(env["server"].url, env["server"].admin_key).call(
        "GET", f"/api/projects/{link.project_id}/")["description"]
    assert desc.startswith("RLHF pipeline, last pull: imported. Labellers held back, their "
                           f"votes dropped: {REVERSED}: ")


@pytest.mark.parametrize("stop_at", ["before the import", "after the import"])
def test_a_pull_stopped_midway_and_repeated_imports_the_batch_once(env, monkeypatch,
                                                                   stop_at):
    env["cfg"] = env["cfg"].model_copy(update={"collect": env["cfg"].collect.model_copy(
        update={"destination": env["cfg"].collect.destination.model_copy(
            update={"annotations_per_task": 1})})})
    cid, record, link = collection(env)
    annotate(env, link, GOOD, truth)
    real = pull.import_labels.fn

    def killed(*args):
        if stop_at == "after the import":
            real(*args)
        raise KeyboardInterrupt  # the process stopped here

    monkeypatch.setattr(pull.import_labels, "fn", killed)
    with pytest.raises(KeyboardInterrupt):
        pull.pull(env["cfg"], cid)
    monkeypatch.setattr(pull.import_labels, "fn", real)
    (again,) = pull.pull(env["cfg"], cid)
    assert again.status == "done"  # the pending pull was finished first
    batches = list(env["watch"].glob("labelled-*.jsonl"))
    assert len(batches) == 1 and len(env["events"]) == 1
    assert len([json.loads(x) for x in batches[0].read_text().splitlines()]) == \
        N_PAIRS - N_KNOWN
    done = list((Path(env["cfg"].collect.out_dir) / "pulls" / cid / "done").glob("*"))
    assert len(done) == 1


def test_edited_texts_and_unexpected_answers_are_left_out_by_id(env):
    cid, record, link = collection(env, n=32, known=26)
    admin = LabelStudio(env["server"].url, env["server"].admin_key)
    edited = sorted(link.tasks)[-1]
    admin.call("PATCH", f"/api/tasks/{edited}/", {"data": {
        **admin.call("GET", f"/api/tasks/{edited}/")["data"], "response_a": "a better one"}})
    odd = sorted(link.tasks)[-2]
    for who in (GOOD, SECOND, REVERSED):
        annotate(env, link, who, lambda i: "Maybe" if i == 30 else truth(i))
    (out,) = pull.pull(env["cfg"], cid, partial=True)
    text = out.text()
    assert f"task {edited}: its texts were edited in Label Studio" in text
    assert f"task {odd}, annotation" in text and "answer 'Maybe' is not one of" in text
    assert out.new_pairs == 30 and out.status == "imported", text


def test_faults_end_in_one_sentence(env, monkeypatch):
    cfg, client = env["cfg"], env["client"]
    cid, record, link = collection(env, n=4, known=0)
    monkeypatch.setenv(KEY_VAR, "eyJhbGciOiJIUzI1NiJ9.eyJ0b2tlbl90eXBlIjoicmVmcmVzaCJ9.bad")
    with pytest.raises(LabelStudioError, match="refused the personal access token in "
                                               "LABEL_STUDIO_API_KEY"):
        pull.pull(cfg, cid)
    monkeypatch.setenv(KEY_VAR, "not-a-legacy-token")
    with pytest.raises(LabelStudioError, match="refused the legacy token"):
        pull.pull(cfg, cid)
    monkeypatch.delenv(KEY_VAR)
    with pytest.raises(LabelStudioError, match="LABEL_STUDIO_API_KEY is not set"):
        pull.pull(cfg, cid)
    monkeypatch.setenv(KEY_VAR, env["server"].legacy_key)  # legacy tokens work too
    assert pull.pull(cfg, cid)[0].status == "nothing new"
    admin = LabelStudio(env["server"].url, env["server"].admin_key)
    admin.whoami()
    admin._access = "eyJexpired.access.token"  # an access token that ran out: renewed once
    admin.call("PATCH", f"/api/projects/{link.project_id}/", {"title": "renamed pairs"})
    monkeypatch.setenv(KEY_VAR, env["server"].admin_key)
    assert pull.pull(cfg, cid)[0].status == "nothing new"  # the link is by project id
    LabelStudio(env["server"].url, env["server"].admin_key).call(
        "DELETE", f"/api/projects/{link.project_id}/")
    with pytest.raises(LabelStudioError, match=f"collection {cid}: its Label Studio project "
                                               f"{link.project_id} .* no longer exists"):
        pull.pull(cfg, cid)
    from tests.servers import free_port

    monkeypatch.setenv(URL_VAR, f"http://127.0.0.1:{free_port()}")
    start = time.perf_counter()
    with pytest.raises(LabelStudioError, match="does not answer"):
        LabelStudio.from_env().whoami()
    assert time.perf_counter() - start < 10
    files = client.create_run(experiment_for(client, cfg), tags={
        COLLECTION_TAG: "v1-files00", "rlhf.collection.file": "to_label/v1-files00.jsonl"})
    client.set_terminated(files.info.run_id)
    with pytest.raises(LabelStudioError, match="was written to files .* `rlhf label import"):
        pull.pull(cfg, "v1-files00")
    # the reverse: a labelled file of a Label Studio collection is refused by `label import`
    labelled = env["watch"].parent / "labelled.jsonl"
    labelled.write_text("".join(json.dumps({"id": r["id"], "choice": "a"}) + "\n"
                                for r in record))
    with pytest.raises(LabelStudioError, match=f"collection {cid}, which went to Label "
                                               f"Studio .* `rlhf label pull {cid}`"):
        refuse_studio_rows(cfg, labelled)
    labelled.write_text(json.dumps({"id": "v1-files00-0000", "choice": "a"}) + "\n")
    refuse_studio_rows(cfg, labelled)  # a file collection's rows pass
