"""Live stage progress: metrics still reach the stage's logger, a log line per call, and a
Prefect progress artifact that ends at 100 % inside a flow run."""

import io
import logging

from tasks.pipeline.stages.progress import StageProgress


def test_forwards_metrics_and_logs_a_line_per_call(caplog):
    seen = []
    live = StageProgress("sft", 4, lambda step, m: seen.append((step, m)))
    with caplog.at_level(logging.INFO, logger="rlhf.progress"):
        live(2, {"train/loss": 1.5})
        live(4, {"train/loss": 1.25})
    assert seen == [(2, {"train/loss": 1.5}), (4, {"train/loss": 1.25})]
    lines = [r.getMessage() for r in caplog.records if r.name == "rlhf.progress"]
    assert lines == ["sft: step 2/4 (50%) train/loss=1.5", "sft: step 4/4 (100%) train/loss=1.25"]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_stage_with_a_bar_keeps_its_lines_off_the_terminal_but_in_a_log_file():
    terminal, log_file = _Terminal(), io.StringIO()
    logger = logging.getLogger("rlhf.progress")
    handlers = [logging.StreamHandler(terminal), logging.StreamHandler(log_file)]
    for h in handlers:
        logger.addHandler(h)
    logger.setLevel(logging.INFO)
    try:
        StageProgress("ppo", 2, bar=True)(1, {"objective/kl": 0.5})
        StageProgress("sft", 2)(1, {"train/loss": 1.0})  # no bar: the terminal gets its line
    finally:
        for h in handlers:
            logger.removeHandler(h)
    assert terminal.getvalue() == "sft: step 1/2 (50%) train/loss=1\n"
    assert log_file.getvalue() == ("ppo: step 1/2 (50%) objective/kl=0.5\n"
                                   "sft: step 1/2 (50%) train/loss=1\n")


def test_progress_artifact_tracks_the_steps_inside_a_flow(prefect_api):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
    from prefect.runtime import flow_run

    @flow
    def stage() -> str:
        live = StageProgress("reward_model", 3)
        for step in (1, 2, 3):
            live(step)
        return flow_run.id

    run_id = stage()
    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[run_id])))
    assert [(a.key, a.type, a.data) for a in arts] == [
        ("rlhf-reward-model-progress", "progress", 100.0)]


def test_artifact_writes_are_throttled_but_the_last_step_is_written(monkeypatch):
    now = [0.0]
    live = StageProgress("sft", 10, min_interval_s=5.0, clock=lambda: now[0])
    written = []
    monkeypatch.setattr(live, "_artifact", written.append)
    for step in range(1, 11):
        now[0] = float(step)  # one second a step
        live(step)
    assert written == [10.0, 60.0, 100.0]  # step 1, step 6 (5 s later), the last step
