"""What a pipeline run was made from: the config hash and a digest of every input data set.
A re-run reuses finished stages only when both are unchanged; the demo's data is hashed as
generated, so a change of the generator is a change of input too."""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tasks.config.pipeline_config import PipelineConfig
from tasks.platform.mlflow.tags import (
    CONFIG_HASH_TAG,
    GIT_COMMIT_TAG,
    INPUT_DIGEST_PREFIX,
    PREFECT_FLOW_RUN_TAG,
    RUN_NAME_TAG,
    SEED_TAG,
    VERSION_PREFIX,
)
from tasks.platform.redact import redacted

PACKAGES = ("torch", "transformers", "prefect", "mlflow", "datasets", "great_expectations")


class ResumeRefused(ValueError):
    """A resume whose inputs changed since the run began; the message names what changed."""


@dataclass(frozen=True)
class RunIdentity:
    """A run's identity, computed once before its parent run is found or created: the config
    (redacted, as recorded) and its hash, the inputs' digests, its name and flow run."""

    cfg: PipelineConfig
    run_name: str
    flow_run_id: str | None
    config_hash: str
    digests: dict[str, str]
    config: dict

    @classmethod
    def of(cls, cfg: PipelineConfig, run_name: str, flow_run_id: str | None) -> RunIdentity:
        return cls(cfg, run_name, flow_run_id, cfg.config_hash(), input_digests(cfg),
                   redacted(cfg.model_dump(mode="json")))

    def changes(self, tags: dict[str, str], include_config: bool = True) -> list[str]:
        """What differs between a run's tags and this identity, in words (empty: nothing)."""
        changes = []
        if include_config and tags.get(CONFIG_HASH_TAG) != self.config_hash:
            changes.append(f"the config (hash {tags.get(CONFIG_HASH_TAG)} -> {self.config_hash})")
        recorded = {k.removeprefix(INPUT_DIGEST_PREFIX): v for k, v in tags.items()
                    if k.startswith(INPUT_DIGEST_PREFIX)}
        data = self.cfg.data
        for role in sorted(set(recorded) | set(self.digests)):
            if recorded.get(role) != self.digests.get(role):
                where = ""
                if data is not None and getattr(data, role, None) is not None:
                    where = f" ({getattr(data, role).path})"
                before, now = recorded.get(role, "not recorded"), self.digests.get(role, "absent")
                changes.append(f"the {role} data{where} (digest {before} -> {now})")
        return changes

    def check_resume(self, run) -> None:
        """An explicit resume may change settings (recorded) but never its data."""
        changes = self.changes(run.data.tags, include_config=False)
        if changes:
            raise ResumeRefused(
                f"cannot resume run {run.info.run_id}: its inputs changed since it began: "
                f"{'; '.join(changes)}. Its finished stages were made from the old data. "
                "Restore the data, or start a new run (without --resume, or with another "
                "tracking.run_name).")

    def new_run_tags(self) -> dict[str, str]:
        """A new run's tags: name, config hash, seed, versions, input digests, commit, flow run."""
        tags = {RUN_NAME_TAG: self.run_name, CONFIG_HASH_TAG: self.config_hash,
                SEED_TAG: str(self.cfg.seed)}
        for name in PACKAGES:
            try:
                tags[VERSION_PREFIX + name] = md.version(name)
            except md.PackageNotFoundError:
                tags[VERSION_PREFIX + name] = "absent"
        tags.update({INPUT_DIGEST_PREFIX + role: value for role, value in self.digests.items()})
        commit = git_commit()
        if commit:
            tags[GIT_COMMIT_TAG] = commit
        if self.flow_run_id:
            tags[PREFECT_FLOW_RUN_TAG] = str(self.flow_run_id)
        return tags


def git_commit() -> str | None:
    """HEAD of the git checkout the code runs from, when there is one."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


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
        paths = generate_demo_data(tmp, cfg.seed, d.sizes(), d.rm_length_bias, d.chat, d.system)
        return {role: source_digest(str(path)) for role, path in paths.items()}
