"""What can be checked before Prefect or MLflow start: data present, model folder or hub id
shape, workdir, resume id. Each failure is a ConfigError naming the field and the fix."""

from __future__ import annotations

import re
from pathlib import Path

from data_checks.files import looks_local
from flows.config import ConfigError
from tasks.config import PipelineConfig

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def check_model_source(field: str, value: str | None) -> None:
    if not value:
        return
    if looks_local(value):
        path = Path(value).expanduser()
        if not path.is_dir():
            what = "is a file, not a model folder" if path.exists() else "does not exist"
            raise ConfigError(f"{field}={value}: the folder {what}. Give a local model folder "
                              "(with config.json) or a hub id such as 'gpt2' or "
                              "'EleutherAI/pythia-160m'.")
        if field == "model.base_model" and not (path / "config.json").exists():
            raise ConfigError(f"{field}={value}: no config.json in the folder, so it is not a "
                              "Hugging Face model folder (save one with save_pretrained).")
    elif not HUB_ID.match(value):
        raise ConfigError(f"{field}={value!r}: neither an existing local folder nor a hub id "
                          "of the form 'name' or 'owner/name'.")


def check_config(cfg: PipelineConfig) -> None:
    """Config-level checks that need no run (data present, model, workdir)."""
    if cfg.data is None and not cfg.demo.enabled:
        raise ConfigError("no data: the config has neither a `data:` section (sft, preference, "
                          "prompts) nor `demo.enabled: true`. Add one of them.")
    if not cfg.demo.enabled and not cfg.model.base_model:
        raise ConfigError("no base model: set model.base_model to a local model folder or a "
                          "hub id (or demo.enabled: true for the built-in tiny model).")
    check_model_source("model.base_model", cfg.model.base_model)
    check_model_source("model.tokenizer", cfg.model.tokenizer)
    workdir = Path(cfg.tracking.workdir).expanduser()
    if workdir.exists() and not workdir.is_dir():
        raise ConfigError(f"tracking.workdir={cfg.tracking.workdir}: is a file, not a folder. "
                          "Point it at a folder (it is created if missing).")
