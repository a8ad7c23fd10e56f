"""tasks/pipeline/retention.py and finish: a finished run's resume state (the stages' mid-stage
checkpoints) goes unless tracking.keep_resume_state; its outputs stay; a deletion killed after
its rename leaves only a trash folder nothing reads, swept by the next one."""

import os
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from rlhf_core.models.checkpoint import Checkpointer
from tasks.pipeline.finish import close_finished
from tasks.pipeline.retention import TRASH, drop_resume_state, remove_tree, tree_bytes
from tasks.platform.mlflow.runs import RunContext


def _run_folder(root: Path) -> Path:
    """A run folder as a finished run leaves it: two stages' checkpoints beside outputs."""
    for stage, files in {"sft": ("model/model.safetensors", "checkpoints/step_00000002/"
                                 "state.pt", "checkpoints/step_00000002/meta.json"),
                         "ppo": ("policy/model.safetensors", "samples.json",
                                 "checkpoints/step_00000001/state.pt",
                                 "checkpoints/step_00000001/meta.json"),
                         "validate": ("sft.jsonl",)}.items():
        for name in files:
            path = root / stage / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x" * 1000)
    return root


def test_drop_resume_state_deletes_every_checkpoint_folder_and_keeps_the_outputs(tmp_path,
                                                                                   capsys):
    run = _run_folder(tmp_path / "run")
    before = tree_bytes(run)
    out = drop_resume_state(run)
    assert not list(run.rglob("checkpoints"))
    assert (run / "sft" / "model" / "model.safetensors").is_file()
    assert (run / "ppo" / "policy" / "model.safetensors").is_file()
    assert (run / "validate" / "sft.jsonl").is_file()
    assert sorted(Path(r.path).parent.name for r in out.removed) == ["ppo", "sft"]
    assert out.freed_bytes == 4000 and out.kept_bytes == before - 4000 == tree_bytes(run)
    log = capsys.readouterr().out
    assert log.count("retention: deleted") == 2 and log.count("(2000 bytes)") == 2
    assert f"retention: {run} keeps {out.kept_bytes} bytes" in log
    assert drop_resume_state(run).removed == []  # nothing left to find


def test_a_deletion_killed_after_its_rename_leaves_nothing_a_resume_reads(tmp_path,
                                                                          monkeypatch):
    run = _run_folder(tmp_path / "run")
    ck = run / "ppo" / "checkpoints"

    def killed(path, **_):
        raise KeyboardInterrupt  # the process dies between the rename and the delete

    monkeypatch.setattr("tasks.pipeline.retention.shutil.rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        remove_tree(ck)
    monkeypatch.undo()
    assert not ck.exists()
    (trash,) = (run / "ppo").glob(f"{TRASH}*")
    assert (trash / "step_00000001" / "meta.json").is_file()  # whole, under another name
    assert Checkpointer(ck, {}, 1).latest() is None  # a resume finds no half checkpoint
    drop_resume_state(run)  # the next deletion sweeps the trash
    assert not list(run.rglob(f"{TRASH}*")) and not list(run.rglob("checkpoints"))


@pytest.fixture
def finished_ctx(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("t", artifact_location=(tmp_path / "mlruns").as_uri())
    parent = client.create_run(exp).info.run_id
    workdir = _run_folder(tmp_path / "runs" / parent)
    return client, RunContext(tracking_uri=uri, experiment_id=exp, parent_run_id=parent,
                              workdir=str(workdir), seed=0)


@pytest.mark.parametrize("keep", [False, True])
def test_closing_a_finished_run_drops_its_resume_state_unless_kept(finished_ctx, keep):
    client, ctx = finished_ctx
    close_finished(ctx, keep_resume_state=keep)
    assert client.get_run(ctx.parent_run_id).info.status == "FINISHED"
    kept = sorted(p.parent.name for p in Path(ctx.workdir).rglob("checkpoints"))
    assert kept == (["ppo", "sft"] if keep else [])
    assert (Path(ctx.workdir) / "ppo" / "policy" / "model.safetensors").is_file()


def test_a_folder_that_cannot_be_deleted_is_named_and_the_rest_goes(tmp_path, monkeypatch,
                                                                     capsys):
    run = _run_folder(tmp_path / "run")
    real = os.replace

    def refuse(src, dst):
        if Path(src).parent.name == "sft":
            raise PermissionError(13, "Permission denied")
        return real(src, dst)

    monkeypatch.setattr("tasks.pipeline.retention.os.replace", refuse)
    out = drop_resume_state(run)
    assert [Path(r.path).parent.name for r in out.removed] == ["ppo"]
    assert (run / "sft" / "checkpoints").is_dir()
    assert f"could not delete {run / 'sft' / 'checkpoints'}" in capsys.readouterr().out
