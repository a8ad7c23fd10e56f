"""tasks/platform/mlflow/artifacts.py: a stage output's local path, else its MLflow artifact
(cached), else a clear error naming the output and the URI."""

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from pydantic import ValidationError

from tasks.pipeline.stages.records import Artifact, ModelRecord
from tasks.platform.mlflow.artifacts import CACHE, StageOutputMissing, local_copy, publish_path
from tasks.platform.mlflow.runs import RunContext
from tests.shared import ROOT


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
    out = {"model": publish_path(ctx, run_id, model, "checkpoint"),
           "stats": publish_path(ctx, run_id, stats, "norm/stats.json"), "run_id": run_id}
    return ctx, out


def test_publish_records_the_path_and_its_uri(stage):
    ctx, out = stage
    assert out["model"].uri == f"runs:/{out['run_id']}/checkpoint"
    assert out["stats"].uri == f"runs:/{out['run_id']}/norm/stats.json"
    with pytest.raises(ValueError, match="must end with stats.json"):
        publish_path(ctx, out["run_id"], Path(out["stats"].path), "norm/other.json")


def test_local_hit_needs_no_download(stage, monkeypatch):
    ctx, out = stage
    monkeypatch.setattr("mlflow.artifacts.download_artifacts",
                        lambda **_: pytest.fail("downloaded although the folder is here"))
    assert str(local_copy(ctx, out["model"], "sft's model")) == out["model"].path
    assert not (ctx.stage_dir("x").parent / CACHE).exists()


def test_miss_downloads_once_into_the_cache(stage, tmp_path, monkeypatch):
    ctx, out = stage
    gone = Artifact(path=str(tmp_path / "elsewhere" / "model"), uri=out["model"].uri)
    got = local_copy(ctx, gone, "sft's model")
    assert got.is_dir() and CACHE in got.parts and str(got) != out["model"].path
    assert (got / "weights.bin").read_bytes() == b"\x00\x01weights"
    assert json.loads((got / "config.json").read_text()) == {"n": 1}
    stats = local_copy(ctx, Artifact(path=str(tmp_path / "elsewhere" / "stats.json"),
                                     uri=out["stats"].uri), "statistics")
    assert stats.is_file() and json.loads(stats.read_text()) == {"mean": 0.5}
    cache = got.parents[1]
    assert sorted(p.name.startswith(".") for p in cache.iterdir()) == [False, False]  # no tmp
    monkeypatch.setattr("mlflow.artifacts.download_artifacts",
                        lambda **_: pytest.fail("downloaded twice"))
    assert local_copy(ctx, gone, "sft's model") == got  # reused from the cache


def test_missing_artifact_names_the_output_and_uri(stage, tmp_path):
    ctx, out = stage
    bad = Artifact(path=str(tmp_path / "nowhere"), uri=f"runs:/{out['run_id']}/no_such_folder")
    with pytest.raises(StageOutputMissing) as err:
        local_copy(ctx, bad, "sft's model")
    message = str(err.value)
    assert "sft's model" in message and bad.uri in message
    assert not any((tmp_path / "work" / CACHE).iterdir())  # the failed download left nothing
    with pytest.raises(StageOutputMissing, match="recorded no artifact URI"):
        local_copy(ctx, Artifact(path=str(tmp_path / "nowhere")), "sft's model")


def test_a_record_in_an_unknown_shape_is_refused_naming_the_field():
    """Records are strict: a shape no current stage writes (flat ``model_dir`` keys) fails
    loudly rather than reading as a stage that saved nothing."""
    with pytest.raises(ValidationError, match="model_dir"):
        ModelRecord.model_validate({"stage": "sft", "run_id": "r", "model_dir": "/w/sft/model"})


def artifact_path_reads(path):
    """(line, text) of every ``<record>.<artifact>.path`` read: a stage reads its inputs
    through ``StageContext.local``, which downloads what this machine lacks."""
    import ast

    fields = {"data", "tokenizer", "model", "stats_file", "policy"}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr == "path" \
                and isinstance(node.value, ast.Attribute) and node.value.attr in fields:
            yield node.lineno, ast.unparse(node)


def test_no_stage_reads_an_output_path_directly():
    """Every stage and task goes through local_copy, so a stage can run where the producer's
    folders are not (another worker, a resume on another machine)."""
    root = ROOT
    sources = [p for p in sorted((root / "tasks").rglob("*.py")) if p.name != "artifacts.py"]
    found = [f"{p.relative_to(root)}:{line}: {text}" for p in sources
             for line, text in artifact_path_reads(p)]
    assert not found, found


def test_the_walker_sees_direct_reads(tmp_path):
    src = tmp_path / "m.py"
    src.write_text('a = sft.model.path\nb = sc.local(data.tokenizer, "t")\n'
                   'c = out.data.path\nd = champion["policy_dir"]\n')
    assert [line for line, _ in artifact_path_reads(src)] == [1, 3]
