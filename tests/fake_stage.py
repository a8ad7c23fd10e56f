"""A stage context for unit tests of stage bodies: no Prefect, no tracking server."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

from mlflow.tracking import MlflowClient

from tasks.pipeline.stages.context import StageContext
from tasks.pipeline.stages.records import Artifact
from tasks.platform.mlflow.runs import RunContext


class FakeStageContext(StageContext):
    """A stage's context with no tracking server: metrics, tags, artifacts and tables are
    kept here for the test to read; ``client`` is a plain client of a SQLite store in the
    workdir (only register talks to the model registry through it)."""

    def __init__(self, cfg, stage_name: str, workdir: Path, seed: int = 0,
                 tracked: bool = False):
        """``tracked``: the parent and the stage run exist in the SQLite store (register
        logs its models into the stage's run)."""
        from tests.shared import every_stage

        uri = f"sqlite:///{workdir}/mlflow.db"
        exp, parent, run_id = "0", "parent", "stage-run"
        if tracked:
            client = MlflowClient(uri)
            exp = client.create_experiment(f"fake-{stage_name}")
            parent = client.create_run(exp).info.run_id
            run_id = client.create_run(exp).info.run_id
        run = RunContext(tracking_uri=uri, experiment_id=exp, parent_run_id=parent,
                         workdir=str(workdir), seed=seed, progress=False)
        super().__init__(run, cfg, every_stage()[stage_name], run_id=run_id)
        self.metrics: dict[int, dict[str, float]] = {}
        self.parent_metrics: dict[str, float] = {}
        self.tags: dict[str, str] = {}
        self.parent_tags: dict[str, str] = {}
        self.artifacts: dict[str, str] = {}  # artifact path -> local path
        self.tables: dict[str, list[dict]] = {}
        self.parent_tables: dict[str, list[dict]] = {}

    @cached_property
    def client(self):
        return MlflowClient(self.run.tracking_uri)

    @cached_property
    def log(self):
        return lambda step, metrics: self.metrics.setdefault(step, {}).update(metrics)

    def live(self, total: int):
        return self.log

    def log_parent(self, metrics):
        self.parent_metrics.update(metrics)

    def run_tags(self):
        return dict(self.tags)

    def set_tags(self, tags, parent=False, spooled=False):
        (self.parent_tags if parent else self.tags).update(tags)

    def publish(self, path, artifact_path, logged=False):
        self.artifacts[artifact_path] = str(path)
        return Artifact(path=str(path), uri=f"runs:/{self.run_id}/{artifact_path}")

    def log_artifacts(self, folder, artifact_path):
        self.artifacts[artifact_path] = str(folder)

    def log_artifact(self, path, folder):
        self.artifacts[f"{folder}/{Path(path).name}"] = str(path)

    def log_text(self, text, artifact_file):
        self.artifacts[artifact_file] = text

    def log_table(self, rows, artifact_file, spooled=False, parent=False):
        """As MLflow does: rows logged again to a run's table are appended to it; a spooled
        table replaces the file."""
        tables = self.parent_tables if parent else self.tables
        kept = [] if spooled else tables.get(artifact_file, [])
        tables[artifact_file] = kept + rows.to_dict("records")

    def log_datasets(self, files, context):
        return {name: f"digest-of-{Path(path).name}" for name, path in files.items()}

    def local(self, artifact, what):
        assert Path(artifact.path).exists(), f"{what}: {artifact.path}"
        return Path(artifact.path)

    def stop_on_outage(self, ck):
        return ck
