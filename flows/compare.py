"""The compare flow: two registered policy versions through the retrain's gate (validate ->
gate), nothing trained, no alias moved.

No ``from __future__ import annotations`` (Prefect reads the signature's classes).
"""

from prefect import flow

from flows.wiring import tracked
from tasks.config.pipeline_config import ConfigError, PipelineConfig
from tasks.pipeline.finish import finish
from tasks.pipeline.prepare import prepare
from tasks.pipeline.stages.records import Artifact, ModelRecord, PolicyRecord
from tasks.pipeline.stages.validate import validate
from tasks.platform.prefect.prefect_api import rename_flow_run
from tasks.retrain.gate.champion import fetch_champion
from tasks.retrain.gate.stage import gate, resolve_scorer
from tasks.retrain.records import CompareResult


@flow(name="compare", flow_run_name="compare", log_prints=True)
def compare(config: PipelineConfig, champion: str = "1",
            challenger: str = "champion") -> CompareResult:
    """Two registered policy versions (numbers or aliases) through the retrain's gate: both
    answer its held-out prompts, one scorer scores both, the paired bootstrap test decides.
    Nothing trained, no alias moved; recorded as ``rlhf.compare.*`` tags."""
    prep = prepare(config)
    ctx = prep.ctx
    with tracked(ctx, config):
        if resolve_scorer(config, prep.judge) == "judge_model":
            raise ConfigError("rlhf compare: the judge_model scorer is trained in a retrain; "
                              "set retrain.gate.scorer to judge or models:/<name>@<alias>")
        base = fetch_champion(ctx, config, champion)
        other = fetch_champion(ctx, config, challenger)
        if str(base.version) == str(other.version):
            raise ConfigError(f"rlhf compare: '{champion}' and '{challenger}' are both "
                              f"v{base.version}: a version compared with itself says "
                              "nothing; name two different versions")
        compared = f"v{other.version} against v{base.version}"
        rename_flow_run(f"compare-{config.tracking.registered_policy}-v{other.version}-"
                        f"against-v{base.version}")
        data = validate(ctx, config, prep)
        gate_out = gate(ctx, config, prep, data, base,
                        PolicyRecord(policy=Artifact(path=other.policy_dir)),
                        ModelRecord(model=Artifact(path=other.rm_dir)), base.sft_dir,
                        compared=compared)
    result = finish(ctx, {"validate": data, "gate": gate_out}, config.tracking.keep_resume_state)
    return CompareResult(champion=int(base.version), challenger=int(other.version),
                         decision=gate_out.decision, run=result)
