"""A critic-free estimator end to end: no value model is built, loaded, trained or logged."""

from pathlib import Path

from mlflow.tracking import MlflowClient

from tasks.config.pipeline_config import load_config

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "test.yaml"


def test_rloo_pipeline_skips_the_critic_and_its_metrics(tmp_path, prefect_api):
    from flows.pipeline import rlhf_pipeline

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = load_config(CONFIG, [f"tracking.tracking_uri={uri}", f"tracking.workdir={tmp_path}/r",
                               "ppo.advantage_estimator=rloo", "ppo.samples_per_prompt=2",
                               "tracking.register_models=false"])
    result = rlhf_pipeline(config=cfg)
    client = MlflowClient(uri)
    children = client.search_runs(
        [result.experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{result.parent_run_id}'")
    by_stage = {r.data.tags["rlhf.stage"]: r for r in children}
    critic = by_stage["critic_init"]
    assert critic.info.status == "FINISHED"
    assert "rloo" in critic.data.tags["rlhf.critic_skipped"]
    workdir = Path(result.workdir)
    assert not (workdir / "critic_init" / "model").exists()
    assert not (workdir / "ppo" / "value_model").exists()
    ppo = by_stage["ppo"].data.metrics
    assert "loss/policy_avg" in ppo and "objective/kl" in ppo
    assert not {"loss/value_avg", "val/clipfrac_avg", "val/explained_variance"} & set(ppo)
    assert client.get_run(result.parent_run_id).data.params["ppo.advantage_estimator"] \
        == "rloo"
    assert "eval/kl_to_ref" in client.get_run(result.parent_run_id).data.metrics
