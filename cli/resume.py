"""The config `rlhf run --resume <id>` continues with: the one the run recorded in MLflow.

This command's --set overrides go on top (a deliberate change, recorded with the run). A --config
given too must match the recorded config in every key --set does not change, else it is refused,
naming the keys, before anything runs.
"""

from __future__ import annotations

import json

from cli.runs import check_resume_id
from tasks.config.pipeline_config import (
    ConfigError,
    PipelineConfig,
    flatten,
    load_config,
    parse_override,
)
from tasks.platform.mlflow.addresses import default_tracking_uri
from tasks.platform.mlflow.queries import StoreError, recorded_config
from tasks.platform.prefect.logins import login_out_of_uri
from tasks.platform.prefect.preflight import check_servers
from tasks.platform.redact import redacted

SHOWN = 6  # differing keys named in the refusal; the rest are counted


def overrides_of(args) -> list[str]:
    """This command's --set overrides, --nproc as ``model.nproc``."""
    nproc = [] if getattr(args, "nproc", None) is None else [f"model.nproc={args.nproc}"]
    return list(args.set or []) + nproc


def _store_of(overrides: list[str]) -> str | None:
    """The store a --set names (its login moved into MLflow's variables), else None."""
    uris = [value for key, value in map(parse_override, overrides)
            if key == "tracking.tracking_uri" and value]
    if not uris:
        return None
    bare = login_out_of_uri(PipelineConfig.model_validate({"tracking": {"tracking_uri":
                                                                        str(uris[-1])}}))
    return bare.tracking.tracking_uri


def _set_by(key: str, overrides: list[str]) -> bool:
    """Is ``key`` (or a section above it) given by one of the --set overrides?"""
    given = [parse_override(item)[0] for item in overrides]
    return any(key == g or key.startswith(g + ".") for g in given)


def config_differences(recorded: dict, cfg: PipelineConfig,
                       overrides: list[str]) -> list[str]:
    """Keys whose value in ``cfg`` differs from the run's ``recorded`` config, those the
    overrides set left out: ``ppo.kl_coef (0.1 here, 0.05 in the run)``."""
    run = flatten(PipelineConfig.model_validate(recorded).model_dump(mode="json"))
    here = flatten(redacted(cfg.model_dump(mode="json")))
    out = []
    for key in sorted(set(run) | set(here)):
        if run.get(key) != here.get(key) and not _set_by(key, overrides):
            out.append(f"{key} ({json.dumps(here.get(key))} here, "
                       f"{json.dumps(run.get(key))} in the run)")
    return out


def resume_config(args) -> PipelineConfig:
    """The config for ``rlhf run --resume <id>`` (module doc); ConfigError, one sentence,
    for a run the store does not have, a stage's run, or a --config that differs."""
    overrides = overrides_of(args)
    given = login_out_of_uri(load_config(args.config, overrides)) if args.config else None
    uri = given.tracking.tracking_uri if given else _store_of(overrides)
    check_servers(uri, prefect=False)
    check_resume_id(uri, args.resume, args.argv)
    try:
        recorded, path = recorded_config(default_tracking_uri(uri), args.resume)
        run_cfg = load_config(None, overrides, base=recorded)
    except StoreError as err:
        raise ConfigError(f"--resume {args.resume}: {err}; give the run's config with "
                          "--config") from None
    except ConfigError as err:
        raise ConfigError(f"--resume {args.resume}: the config the run recorded ({path}) "
                          f"does not load here: {err}") from None
    if given is None:
        return login_out_of_uri(run_cfg)
    differ = config_differences(recorded, given, overrides)
    if differ:
        more = f" and {len(differ) - SHOWN} more" if len(differ) > SHOWN else ""
        raise ConfigError(
            f"cannot resume run {args.resume} with --config {args.config}: it differs from the "
            f"config the run recorded in MLflow ({path}) in {', '.join(differ[:SHOWN])}{more}; "
            "leave out --config to continue with the run's own config, or --set a key to "
            "change it on purpose (the change is recorded with the run).")
    return given
