"""The champion a challenge starts from and is gated against: which version holds the alias,
and its models downloaded from MLflow."""

from __future__ import annotations

from prefect import task
from pydantic import BaseModel, ConfigDict

from tasks.config.pipeline_config import PipelineConfig
from tasks.platform.mlflow import registry
from tasks.platform.mlflow.addresses import default_tracking_uri
from tasks.platform.mlflow.registry import CHAMPION, RegistryError
from tasks.platform.mlflow.runs import RunContext, tag_parent, tracking_client
from tasks.platform.mlflow.tags import ANCESTRY_TAG, RETRAIN_CHAMPION_VERSION_TAG


def resolve_version(client, name: str, ref: str):
    """A registered version by number or alias (RegistryError when there is none)."""
    ref = ref.removeprefix("@")
    if ref.isdigit():
        version = registry.model_version(client, name, ref)
        if version is None:
            raise RegistryError(f"registered model '{name}' has no version {ref}")
        return version
    version = registry.alias_version(client, name, ref)
    if version is None:
        raise RegistryError(f"registered model '{name}' has no alias '{ref}' (a first "
                            f"`rlhf run` or retrain makes the champion)")
    return version


def champion_version(cfg: PipelineConfig):
    """The registered policy version holding ``champion``, or None."""
    client = tracking_client(default_tracking_uri(cfg.tracking.tracking_uri))
    return registry.alias_version(client, cfg.tracking.registered_policy, CHAMPION)


class Champion(BaseModel):
    """A downloaded policy version: its model folders and the lineage its successor records."""

    model_config = ConfigDict(frozen=True)
    version: str
    sft_run_id: str  # the SFT stage run whose policy is the reference
    ancestry: str  # "v1>v3>v4": the versions this one descends from
    policy_dir: str  # the PPO policy checkpoint (with its tokenizer)
    rm_dir: str  # its reward model
    sft_dir: str  # its SFT policy: reference, RM start, the judge's trunk


@task(name="fetch_champion")
def fetch_champion(ctx: RunContext, cfg: PipelineConfig, which: str = CHAMPION) -> Champion:
    """Download version ``which``'s (number or alias) policy, reward model and SFT policy."""
    client = ctx.client()
    version = resolve_version(client, cfg.tracking.registered_policy, which)
    root = ctx.stage_dir("champion" if which == CHAMPION else f"version-{version.version}")
    got = registry.download_policy(client, version, root, ("ppo", "reward_model", "sft"))
    out = Champion(
        version=str(version.version), sft_run_id=got["sft"][0],
        ancestry=version.tags.get(ANCESTRY_TAG, f"v{version.version}"),
        policy_dir=got["ppo"][1], rm_dir=got["reward_model"][1], sft_dir=got["sft"][1])
    tag_parent(ctx, {RETRAIN_CHAMPION_VERSION_TAG: out.version})
    return out
