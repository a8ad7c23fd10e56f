"""tasks/pipeline/results.py: a flow's result keeps each stage's record class through JSON (a result
Prefect stored), and its accessors read the records, not display strings."""

from tasks.pipeline.results import PipelineResult
from tasks.pipeline.rule import Decision
from tasks.pipeline.stages.records import (
    Artifact,
    DataRecord,
    ModelRecord,
    PolicyRecord,
    RegisterRecord,
)
from tasks.retrain.records import GateRecord, RetrainResult


def _result() -> PipelineResult:
    art = Artifact(path="/w/x", uri="runs:/r/x")
    return PipelineResult(
        parent_run_id="p", experiment_id="1", tracking_uri="sqlite:///m.db", workdir="/w",
        stages={"validate": DataRecord(data=art, tokenizer=art, wall_s=1.04),
                "sft": ModelRecord(model=art, metrics={"train/loss": 0.5}, wall_s=2.0),
                "ppo": PolicyRecord(policy=art, metrics={"objective/kl": 0.1}, wall_s=3.0),
                "gate": GateRecord(decision=Decision(promote=True, reason="won", scorer="j")),
                "register": RegisterRecord(registered=True, model_name="m", version=3)})


def test_records_keep_their_class_through_json():
    result = _result()
    back = PipelineResult.model_validate_json(result.model_dump_json())
    assert back == result
    assert [type(r) for r in back.stages.values()] == [
        DataRecord, ModelRecord, PolicyRecord, GateRecord, RegisterRecord]
    assert back.registered.version == 3 and back.stages["gate"].decision.promote is True
    assert back.data.data.uri == "runs:/r/x" and back.stages["ppo"].metrics == {"objective/kl": 0.1}


def test_figures_over_the_stages():
    result = _result()
    assert result.metrics == {"train/loss": 0.5, "objective/kl": 0.1}
    assert result.wall_s == 6.0  # 1.04 + 2 + 3, to a tenth
    empty = PipelineResult(parent_run_id="p", experiment_id="1", tracking_uri="u", workdir="w",
                           stages={})
    assert empty.registered is None and empty.metrics == {} and empty.wall_s == 0.0


def test_a_retrain_result_keeps_its_run_through_json():
    back = RetrainResult.model_validate_json(RetrainResult(status="promoted", run=_result())
                                             .model_dump_json())
    assert back.run.registered.model_name == "m"
