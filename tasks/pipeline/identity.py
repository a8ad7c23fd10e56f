"""What a pipeline run was made from: the config hash and a digest of every input data set.
A re-run reuses finished stages only when both are unchanged; the demo's data is hashed as
generated, so a change of the generator is a change of input too.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from tasks.config.pipeline_config import PipelineConfig
from tasks.platform.mlflow.tags import CONFIG_HASH_TAG, INPUT_DIGEST_PREFIX


class ResumeRefused(ValueError):
    """A resume whose inputs changed since the run began; the message names what changed."""


def _file_digest(path: Path, digest) -> None:
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)


def source_digest(path: str) -> str:
    """sha256 of a local file or folder's files; a non-local source (a hub id) by its name."""
    p = Path(path).expanduser()
    digest = hashlib.sha256()
    if p.is_file():
        _file_digest(p, digest)
    elif p.is_dir():
        for child in sorted(q for q in p.rglob("*") if q.is_file()):
            digest.update(str(child.relative_to(p)).encode())
            _file_digest(child, digest)
    else:
        return f"id:{path}"
    return digest.hexdigest()[:16]


def input_digests(cfg: PipelineConfig) -> dict[str, str]:
    """{data role: digest} of the run's inputs (the user's data, else the demo's)."""
    if cfg.data is not None:
        return {role: source_digest(source.path) for role in type(cfg.data).model_fields
                if (source := getattr(cfg.data, role)) is not None}
    if not cfg.demo.enabled:
        return {}
    from rlhf_core.demo import generate_demo_data

    d = cfg.demo
    with tempfile.TemporaryDirectory() as tmp:
        paths = generate_demo_data(tmp, cfg.seed, d.sizes(), d.rm_length_bias, d.chat,
                                   d.system)
        return {role: source_digest(str(path)) for role, path in paths.items()}


def digest_tags(digests: dict[str, str]) -> dict[str, str]:
    return {INPUT_DIGEST_PREFIX + role: value for role, value in digests.items()}


def changed_inputs(tags: dict[str, str], cfg: PipelineConfig, digests: dict[str, str],
                   include_config: bool = True) -> list[str]:
    """What differs between a run's recorded identity (its tags) and this config and data, in
    words; empty when nothing does."""
    changes = []
    if include_config and tags.get(CONFIG_HASH_TAG) != cfg.config_hash():
        changes.append(f"the config (hash {tags.get(CONFIG_HASH_TAG)} -> {cfg.config_hash()})")
    recorded = {k.removeprefix(INPUT_DIGEST_PREFIX): v for k, v in tags.items()
                if k.startswith(INPUT_DIGEST_PREFIX)}
    for role in sorted(set(recorded) | set(digests)):
        if recorded.get(role) != digests.get(role):
            where = ""
            if cfg.data is not None and getattr(cfg.data, role, None) is not None:
                where = f" ({getattr(cfg.data, role).path})"
            before, now = recorded.get(role, "not recorded"), digests.get(role, "absent")
            changes.append(f"the {role} data{where} (digest {before} -> {now})")
    return changes
