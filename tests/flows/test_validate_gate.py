"""The gate inside the pipeline: a failed expectation stops `rlhf_pipeline` at validate, with
the GX results logged, and nothing is checkpointed, registered or aliased. (`rlhf validate`
itself: tests/flows/test_cli_validate.py.)"""

import pytest

from data_checks.validate import ValidationFailed
from flows.pipeline import rlhf_pipeline
from tasks.config.pipeline_config import load_config
from tasks.pipeline.retention import OWNER_LOCK
from tests.shared import PREF, parent_runs, write_config


def test_pipeline_stops_at_the_gate_without_checkpoints_or_registry(tmp_path, tiny_model_dir,
                                                                    prefect_api):
    config = write_config(tmp_path, tiny_model_dir,
                          pref=[{**PREF[0], "rejected": PREF[0]["chosen"]}, PREF[1]])
    with pytest.raises(ValidationFailed, match="chosen == rejected"):
        rlhf_pipeline(config=load_config(config, []))
    client, parents, runs = parent_runs(tmp_path)
    assert parents[0].info.status == "FAILED"
    assert {r.data.tags.get("rlhf.stage") for r in runs} == {None, "validate"}
    (child,) = [r for r in runs if r.data.tags.get("rlhf.stage") == "validate"]
    assert child.info.status == "FAILED"
    files = {a.path for a in client.list_artifacts(child.info.run_id)} | \
        {a.path for a in client.list_artifacts(child.info.run_id, "data_docs")}
    assert {"validation_summary.md", "data_docs/results.json", "data_docs/gx"} <= files
    workdir = tmp_path / "runs" / parents[0].info.run_id
    # the stage folders (and the lock a stage's process holds while it runs,
    # tasks/pipeline/retention.py)
    assert sorted(p.name for p in workdir.iterdir()) == [OWNER_LOCK, "validate"]
    assert not list(workdir.rglob("*.safetensors"))
    assert client.search_registered_models() == []
