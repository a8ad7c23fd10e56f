import argparse

import pytest

import cli.main
from cli.main import build_parser, main, summary_text
from tasks.pipeline.results import PipelineResult
from tasks.pipeline.stages.records import Artifact, ModelRecord, PolicyRecord


def test_bad_override_exits_2_naming_the_field(capsys):
    assert main(["run", "--set", "ppo.clip_eps=-3"]) == 2
    assert "ppo.clip_eps" in capsys.readouterr().err


def test_missing_config_file_exits_2(tmp_path, capsys):
    assert main(["run", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml" in capsys.readouterr().err


def test_summary_lists_every_stage_and_the_parent_run():
    result = PipelineResult(
        parent_run_id="abc123", experiment_id="1", tracking_uri="sqlite:///x.db",
        workdir="/tmp/w", stages={"sft": ModelRecord(wall_s=1.5, metrics={"train/loss": 0.5}),
                                  "ppo": PolicyRecord(policy=Artifact(path="/p"), skipped=True)})
    text = summary_text(result, 12.0)
    assert "abc123" in text and "train/loss=0.500" in text and "skipped" in text
    assert "http://127.0.0.1:5000/#/experiments/1/runs?workflowType=machine_learning" in text
    assert "view: mlflow ui --backend-store-uri sqlite:///x.db" in text


def test_the_summary_shows_a_count_whole_and_a_loss_to_three_decimals():
    metrics = {"sft/n_rows": 2000.0, "train/loss": 1.3494, "eval/ok": float("nan")}
    result = PipelineResult(parent_run_id="r", experiment_id="1", tracking_uri="sqlite:///x.db",
                            workdir="/tmp/w", stages={"sft": ModelRecord(metrics=metrics)})
    assert "sft/n_rows=2000, train/loss=1.349, eval/ok=nan" in summary_text(result, 1.0)


def test_on_a_tracking_server_the_summary_links_the_parent_runs_page():
    result = PipelineResult(parent_run_id="abc123", experiment_id="7", workdir="/tmp/w",
                            tracking_uri="http://10.0.0.5:5000/", stages={})
    text = summary_text(result, 1.0)
    assert "view: http://10.0.0.5:5000/#/experiments/7/runs/abc123" in text
    assert "runs table: http://10.0.0.5:5000/#/experiments/7/runs?workflowType=" in text


def test_nproc_sets_model_nproc_and_a_bad_one_exits_2(capsys):
    from cli.main import build_parser
    from cli.runs import config_for

    assert config_for(build_parser().parse_args(["run", "--nproc", "2"])).model.nproc == 2
    assert config_for(build_parser().parse_args(["run"])).model.nproc == 1
    assert main(["run", "--nproc", "0"]) == 2
    assert "model.nproc" in capsys.readouterr().err


def test_the_cli_and_its_read_only_commands_start_without_torch():
    """`rlhf runs` / `rlhf status` / a config error need no model code: importing the CLI
    (and the run bookkeeping it reads runs with) must not load torch or transformers."""
    import subprocess
    import sys

    probe = ("import sys, cli.main, cli.runs, tasks.platform.mlflow.runs; "
             "print(sorted(m for m in ('torch', 'transformers', 'prefect') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def leaf_commands(parser: argparse.ArgumentParser, path: tuple = ()) -> list[tuple]:
    """Every command path the parser takes, read from its sub-parsers (nested in place)."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found.extend(leaf_commands(child, (*path, name)) or [(*path, name)])
    return found


def test_help_ends_with_every_commands_usage_line_and_the_docstring_keeps_none(capsys):
    """The command list is the parser's: a command added anywhere (cli/retrain.py's
    `label pull`, `compare`; cli/notify.py) is in `rlhf --help`, and each line it prints is
    a command that answers its own --help."""
    with pytest.raises(SystemExit) as ended:
        main(["--help"])
    assert ended.value.code == 0
    listed = [line.strip() for line in capsys.readouterr().out.splitlines()
              if line.startswith("  rlhf ")]
    leaves = leaf_commands(build_parser())
    assert {("label", "pull"), ("label", "import"), ("compare",), ("notify",)} <= set(leaves)
    assert len(listed) == len(leaves)
    for line, path in zip(listed, leaves, strict=True):
        assert line.split()[1:1 + len(path)] == list(path), line
        with pytest.raises(SystemExit) as asked:
            build_parser().parse_args([*path, "--help"])
        assert asked.value.code == 0
    assert "\n    rlhf " not in cli.main.__doc__  # no hand-written usage to drift
