"""The served gc: the gc/<name> deployment runs on tracking.gc_schedule (manual runs without
one); its flow, in a Prefect flow run, lists without deleting when told so and otherwise
deletes an older finished run's folder, keeping the champion's."""

import time

from mlflow.tracking import MlflowClient

from flows.gc import gc_flow
from flows.serve import gc_deployment
from tasks.config.pipeline_config import load_config
from tasks.platform.mlflow.tags import PIPELINE_RUN_TAG
from tests.shared import TEST_CONFIG


def test_the_gc_deployment_runs_on_its_schedule_or_by_hand():
    scheduled = load_config(TEST_CONFIG, ["tracking.gc_schedule.interval_s=86400"])
    (schedule,) = gc_deployment(scheduled, "t").schedules
    assert schedule.schedule.interval.total_seconds() == 86400
    assert not gc_deployment(load_config(TEST_CONFIG), "t").schedules


def test_the_gc_flow_lists_then_deletes_and_keeps_the_champions_run(tmp_path, prefect_api):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = load_config(TEST_CONFIG, [f"tracking.tracking_uri={uri}",
                                    f"tracking.workdir={tmp_path}/runs",
                                    "tracking.gc_keep_runs=0"])
    client = MlflowClient(uri)
    exp = client.create_experiment("rlhf-test", artifact_location=(tmp_path / "mlruns").as_uri())
    ids = []
    for age_h in (2, 1):
        run_id = client.create_run(exp).info.run_id
        client.set_terminated(run_id, "FINISHED", end_time=int((time.time() - age_h * 3600) * 1000))
        (tmp_path / "runs" / run_id / "sft" / "model").mkdir(parents=True)
        ids.append(run_id)
    champion, old = ids
    register = client.create_run(exp, tags={"mlflow.parentRunId": champion}).info.run_id
    client.create_registered_model("rlhf-policy")
    version = client.create_model_version("rlhf-policy", f"runs:/{register}/m", run_id=register,
                                          tags={PIPELINE_RUN_TAG: champion})
    client.set_registered_model_alias("rlhf-policy", "champion", version.version)

    dry = gc_flow(config=cfg, delete=False)
    assert [f.target for f in dry.plan.deletions] == [str(tmp_path / "runs" / old)]
    assert dry.deleted == [] and (tmp_path / "runs" / old).is_dir()
    done = gc_flow(config=cfg)
    assert [f.target for f in done.deleted] == [str(tmp_path / "runs" / old)]
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [champion]
