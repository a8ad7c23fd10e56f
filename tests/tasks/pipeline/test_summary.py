"""The run summary says where the critic started and why (tasks/pipeline/results.py notes,
shown by its summary and the CLI)."""

from cli.main import summary_text
from tasks.pipeline.results import PipelineResult, summary_markdown
from tasks.pipeline.stages.critic_init import FROM_POLICY
from tasks.pipeline.stages.records import Artifact, ModelRecord


def test_the_summary_says_where_the_critic_started():
    critic = ModelRecord(model=Artifact(path="/w/c"), metrics={"critic/num_params": 1200.0},
                         figures={"critic": FROM_POLICY}, fresh_head=True, wall_s=0.5)
    result = PipelineResult(parent_run_id="p", experiment_id="1", tracking_uri="sqlite:///m.db",
                            workdir="/w", stages={"critic_init": critic})
    assert result.notes == [f"critic: {FROM_POLICY}"]
    assert f"- critic: {FROM_POLICY}" in summary_markdown(result, "run")
    assert f"critic: {FROM_POLICY}" in summary_text(result, 1.0)
    bare = PipelineResult(parent_run_id="p", experiment_id="1", tracking_uri="sqlite:///m.db",
                          workdir="/w", stages={"critic_init": ModelRecord()})
    assert bare.notes == [] and "critic:" not in summary_markdown(bare, "run")
