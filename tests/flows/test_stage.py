"""The ``rlhf-stage`` flow's side of a routed stage, without a Prefect server: the machine
that runs the stage writes its own hardware over the head's on the child run."""

import torch
from mlflow.tracking import MlflowClient

import flows.stage as stage_flow
from rlhf_core.hardware import hardware_facts
from tasks.config.pipeline_config import PipelineConfig
from tasks.pipeline.stages.context import Stage
from tasks.pipeline.stages.records import Artifact, PolicyRecord
from tasks.platform.mlflow.runs import RunContext, set_tags
from tasks.platform.mlflow.tags import ROUTED_OUTPUT_TAG
from tasks.platform.prefect.remote import stage_spec


def test_a_routed_stage_records_the_hardware_of_the_machine_that_ran_it(tmp_path, monkeypatch,
                                                                         threads_kept):
    monkeypatch.delenv("RLHF_STAGE_WORKDIR", raising=False)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("routed")
    run_id = client.create_run(exp).info.run_id
    set_tags(client, run_id, {"rlhf.hw.cpu": "the head's CPU", "rlhf.hw.threads": "64"})
    ctx = RunContext(tracking_uri=uri, experiment_id=exp, parent_run_id="p",
                     workdir=str(tmp_path), seed=0)
    cfg = PipelineConfig.model_validate({"routing": {"stages": {"ppo": "rlhf-stage/gpu"}},
                                         "model": {"torch_threads": 1, "device": "cpu"}})
    seen = {}

    def fake_ppo(sc) -> PolicyRecord:
        seen["tags"] = MlflowClient(uri).get_run(sc.run_id).data.tags  # before the work
        return PolicyRecord(policy=Artifact(path="/gpu/ppo/policy"))

    monkeypatch.setitem(stage_flow.STAGES, "ppo", Stage("ppo", fake_ppo, PolicyRecord,
                                                        ranks=True))
    torch.set_num_threads(3)
    out = stage_flow.rlhf_stage.fn("ppo", stage_spec(ctx, cfg, "ppo", run_id, {}))
    assert out.policy == Artifact(path="/gpu/ppo/policy")
    facts = {f"rlhf.hw.{k}": v for k, v in {**hardware_facts("cpu"), "threads": "1"}.items()}
    assert {k: seen["tags"][k] for k in facts} == facts
    assert ROUTED_OUTPUT_TAG in client.get_run(run_id).data.tags
