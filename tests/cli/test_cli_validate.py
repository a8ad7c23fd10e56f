"""`rlhf validate`: the data gate alone, tracked; exit 0 when every expectation passes, 1 when
one fails (each failure named with example rows), 2 for a malformed file or config (the
message, no traceback, nothing started)."""

import json

from cli.main import main

# imported outside capsys: Prefect binds its log handler to import-time stderr
from flows.pipeline import rlhf_validate  # noqa: F401
from tests.shared import PREF, SFT, parent_runs, write_config


def _markdown_artifact(flow_run_id: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        ArtifactFilterKey,
    )

    with get_client(sync_client=True) as prefect:
        (artifact,) = prefect.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=["rlhf-data-validation"]),
            flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    assert artifact.type == "markdown"
    return artifact.data


def test_malformed_file_exits_2_naming_file_and_line_before_anything_starts(
        tmp_path, tiny_model_dir, capsys):
    config = write_config(tmp_path, tiny_model_dir, sft_text='{"prompt": "a"\n')
    for command in ("validate", "run"):
        assert main([command, "--config", str(config)]) == 2
        err = capsys.readouterr().err
        assert f"{tmp_path / 'sft.jsonl'} line 1: invalid JSON" in err
        assert "Traceback" not in err
    assert parent_runs(tmp_path)[1] == []  # nothing tracked, nothing started


def test_bad_validation_setting_exits_2_naming_the_field(tmp_path, tiny_model_dir, capsys):
    config = write_config(tmp_path, tiny_model_dir)
    assert main(["validate", "--config", str(config),
                 "--set", "validation.max_dropped_fraction=2"]) == 2
    err = capsys.readouterr().err
    assert "validation.max_dropped_fraction" in err and "Traceback" not in err


def test_validate_passes_on_good_data_and_logs_docs(tmp_path, tiny_model_dir, capsys,
                                                    prefect_api):
    config = write_config(tmp_path, tiny_model_dir)
    assert main(["validate", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "data validation PASSED" in out and "rows kept: sft 2, preference 2" in out
    assert "expectations passed: sft 8/8, preference 14/14, prompts 4/4" in out
    client, parents, runs = parent_runs(tmp_path)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert parents[0].data.tags["rlhf.validate_only"] == "true"
    (child,) = [r for r in runs if r.data.tags.get("rlhf.stage") == "validate"]
    files = {a.path for a in client.list_artifacts(child.info.run_id, "data_docs")}
    assert {"data_docs/index.html", "data_docs/results.json", "data_docs/gx"} <= files
    assert "gx/index.html" in {a.path[len("data_docs/"):] for a in
                               client.list_artifacts(child.info.run_id, "data_docs/gx")}
    assert not (tmp_path / "runs" / parents[0].info.run_id / "sft").exists()
    summary = _markdown_artifact(parents[0].data.tags["rlhf.prefect_flow_run_id"])
    assert "PASSED" in summary and "| preference | 14/14 | 2 |" in summary


def test_validate_fails_with_exit_1_naming_every_failed_expectation(tmp_path, tiny_model_dir,
                                                                    capsys, prefect_api):
    bad = [{**PREF[0], "rejected": PREF[0]["chosen"]}, {**PREF[1], "chosen": ""}]
    sft = "".join(json.dumps(row) + "\n" for row in (SFT[0], SFT[1], SFT[0]))
    config = write_config(tmp_path, tiny_model_dir, pref=bad, sft_text=sft)
    assert main(["validate", "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert "1 pairs have chosen == rejected: rows 1" in err and "empty chosen" in err
    assert "row 1" in err and "Traceback" not in err
    # the warnings of a failed gate reach the terminal too
    assert "warning: sft (" in err and "1 rows repeat another row's prompt + response: " \
        "rows 3 (kept" in err
    client, parents, runs = parent_runs(tmp_path)
    assert parents[0].info.status == "FAILED"
    (child,) = [r for r in runs if r.data.tags.get("rlhf.stage") == "validate"]
    docs = client.download_artifacts(child.info.run_id, "data_docs/results.json",
                                     str(tmp_path / "dl"))
    assert json.loads(open(docs).read())["preference"]["success"] is False
    # the Prefect UI shows the verdict too, failures and all
    summary = _markdown_artifact(parents[0].data.tags["rlhf.prefect_flow_run_id"])
    assert "FAILED" in summary and "chosen == rejected" in summary
    assert child.info.run_id in summary


def test_set_overrides_reach_the_gate(tmp_path, tiny_model_dir, capsys, prefect_api):
    config = write_config(tmp_path, tiny_model_dir)
    assert main(["validate", "--config", str(config),
                 "--set", "validation.max_prompt_tokens=1"]) == 1
    err = capsys.readouterr().err
    assert "1.000 of the sft rows were dropped" in err and "max_dropped_fraction 0.1" in err
