"""tasks/artifacts.py: a stage output's local path, else its MLflow artifact (cached), else a
clear error naming the stage, the key and the URI."""

import json

import pytest
from mlflow.tracking import MlflowClient

from tasks.artifacts import CACHE, StageOutputMissing, local_path, publish, uri_key
from tasks.tracking import RunContext


@pytest.fixture
def stage(tmp_path):
    """A run context on a fresh SQLite store and a finished 'sft' run that logged a model
    folder and a stats file through publish -> (ctx, output record)."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("t", artifact_location=(tmp_path / "mlruns").as_uri())
    parent = client.create_run(exp).info.run_id
    run_id = client.create_run(exp).info.run_id
    ctx = RunContext(tracking_uri=uri, experiment_id=exp, parent_run_id=parent,
                     workdir=str(tmp_path / "work"), seed=0)
    model = tmp_path / "stage" / "model"
    model.mkdir(parents=True)
    (model / "weights.bin").write_bytes(b"\x00\x01weights")
    (model / "config.json").write_text(json.dumps({"n": 1}))
    stats = tmp_path / "stage" / "stats.json"
    stats.write_text('{"mean": 0.5}')
    out = {"stage": "sft", "run_id": run_id, "model_dir": str(model), "stats_path": str(stats)}
    publish(ctx, run_id, out, "model_dir", "checkpoint")
    publish(ctx, run_id, out, "stats_path", "norm/stats.json")
    return ctx, out


def test_uri_keys():
    assert [uri_key(k) for k in ("model_dir", "stats_path", "tokenizer", "policy_dir")] == \
        ["model_uri", "stats_uri", "tokenizer_uri", "policy_uri"]


def test_local_hit_needs_no_download(stage, monkeypatch):
    ctx, out = stage
    assert out["model_uri"] == f"runs:/{out['run_id']}/checkpoint"
    monkeypatch.setattr("mlflow.artifacts.download_artifacts",
                        lambda **_: pytest.fail("downloaded although the folder is here"))
    assert str(local_path(ctx, out, "model_dir")) == out["model_dir"]
    assert not (ctx.stage_dir("x").parent / CACHE).exists()


def test_miss_downloads_once_into_the_cache(stage, tmp_path, monkeypatch):
    ctx, out = stage
    gone = {**out, "model_dir": str(tmp_path / "elsewhere" / "model"),
            "stats_path": str(tmp_path / "elsewhere" / "stats.json")}
    got = local_path(ctx, gone, "model_dir")
    assert got.is_dir() and CACHE in got.parts and str(got) != out["model_dir"]
    assert (got / "weights.bin").read_bytes() == b"\x00\x01weights"
    assert json.loads((got / "config.json").read_text()) == {"n": 1}
    stats = local_path(ctx, gone, "stats_path")
    assert stats.is_file() and json.loads(stats.read_text()) == {"mean": 0.5}
    cache = got.parents[1]
    assert sorted(p.name.startswith(".") for p in cache.iterdir()) == [False, False]  # no tmp
    monkeypatch.setattr("mlflow.artifacts.download_artifacts",
                        lambda **_: pytest.fail("downloaded twice"))
    assert local_path(ctx, gone, "model_dir") == got  # reused from the cache


def test_missing_artifact_names_stage_key_and_uri(stage, tmp_path):
    ctx, out = stage
    bad = {**out, "model_dir": str(tmp_path / "nowhere"),
           "model_uri": f"runs:/{out['run_id']}/no_such_folder"}
    with pytest.raises(StageOutputMissing) as err:
        local_path(ctx, bad, "model_dir")
    message = str(err.value)
    assert "stage sft" in message and "'model_dir'" in message and bad["model_uri"] in message
    assert not any((tmp_path / "work" / CACHE).iterdir())  # the failed download left nothing
    with pytest.raises(StageOutputMissing, match="recorded no artifact URI"):
        local_path(ctx, {"stage": "sft", "model_dir": str(tmp_path / "nowhere")}, "model_dir")


PATH_KEYS = {"model_dir", "policy_dir", "stats_path", "data_dir", "tokenizer", "value_dir"}
# the parameter names the stage tasks and flows give other stages' output records
RECORDS = {"data", "sft_out", "rm_out", "norm_out", "critic_out", "ppo_out", "start"}


def direct_reads(path):
    """(line, text) of every ``record["<path key>"]`` / ``record.get("<path key>")`` read."""
    import ast

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            target, key = node.value, node.slice
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "get" and node.args:
            target, key = node.func.value, node.args[0]
        else:
            continue
        if isinstance(target, ast.Name) and target.id in RECORDS \
                and isinstance(key, ast.Constant) and key.value in PATH_KEYS:
            yield node.lineno, ast.unparse(node)


def test_no_stage_reads_an_output_path_directly():
    """Every consumer goes through local_path, so a stage can run where the producer's
    folders are not (another worker, a resume on another machine)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    sources = [p for d in ("tasks", "flows") for p in sorted((root / d).glob("*.py"))
               if p.name != "artifacts.py"]
    found = [f"{p.relative_to(root)}:{line}: {text}" for p in sources
             for line, text in direct_reads(p)]
    assert not found, found


def test_the_walker_sees_direct_reads(tmp_path):
    src = tmp_path / "m.py"
    src.write_text('a = sft_out["model_dir"]\nb = data.get("tokenizer")\n'
                   'c = {"model_dir": 1}\nd = champion["policy_dir"]\n')
    assert [line for line, _ in direct_reads(src)] == [1, 2]
