"""PPO's health in the pipeline: the held-out check and the detectors (rlhf_core/health) set up
from the run's config, and what a finding sets off: tags and ``health.json`` on both runs, a
log warning and the Prefect event ``rlhf.ppo.unhealthy`` for users' automations. After a stop
the policy is the last healthy snapshot, which register will not promote without an override."""

from __future__ import annotations

import json
import logging
from functools import partial
from pathlib import Path

import pandas as pd
import torch

from rlhf_core.health.detectors import BY_NAME, for_scorer
from rlhf_core.health.records import Finding
from rlhf_core.health.watch import CheckAnswers, HeldOutCheck, Verdict, Watch
from rlhf_core.models.loader import load_pretrained
from tasks.pipeline.judge import resolve_judge
from tasks.pipeline.stages.context import StageContext
from tasks.pipeline.stages.records import HealthFinding, HealthRecord, ModelRecord
from tasks.platform.files import read_jsonl
from tasks.platform.mlflow.models import load_pyfunc, pyfunc_scores
from tasks.platform.mlflow.tags import HEALTH_FLAGS_TAG, HEALTH_PREFIX, HEALTH_STOPPED_TAG
from tasks.platform.prefect.events import DETECTOR_LABEL, RUN_RESOURCE, UNHEALTHY, emit
from tasks.platform.prefect.prefect_api import in_prefect_run
from tasks.platform.prefect.preflight import prefect_api_url

ARTIFACT_KEY = "rlhf-ppo-checks"
SHOWN_ANSWERS = 8  # answers of a check in the Prefect artifact

log = logging.getLogger(__name__)


def held_out_prompts(data_dir: Path, n: int) -> tuple[list[str], bool]:
    """The first ``n`` held-out prompts (else training prompts) -> (prompts, held out)."""
    path = data_dir / "eval_prompts.jsonl"
    held_out = path.exists()
    rows = read_jsonl(path if held_out else data_dir / "prompts.jsonl")
    return [r["prompt"] for r in rows[:n]], held_out


def make_watch(sc: StageContext, data_dir: Path, judge: ModelRecord | None,
               gold_name: str) -> tuple[Watch | None, list[str]]:
    """The ppo stage's watch (None when health is off) and its check's prompts."""
    cfg = sc.cfg.ppo
    if not cfg.health.enabled:
        return None, []
    prompts, held_out = held_out_prompts(data_dir, cfg.eval_prompts)
    if not held_out:
        log.warning("ppo: no eval_prompts data: the held-out checks answer %d training "
                    "prompts (give data.eval_prompts for prompts the policy never trains on)",
                    len(prompts))
    model = external = None
    # a load may draw random numbers: fork the RNG so training samples as it would without
    if cfg.health.external_scorer is not None:
        with torch.random.fork_rng(devices=[]):
            scorer = load_pyfunc(cfg.health.external_scorer, sc.run.tracking_uri)
        external = partial(pyfunc_scores, scorer)
    elif judge is not None and judge.model is not None:
        with torch.random.fork_rng(devices=[]):
            model = load_pretrained(sc.local(judge.model, "judge_model's model"), sc.spec, "scalar",
                                    trainable=False)
    check = HeldOutCheck(prompts, sc.cfg.eval.sampling, sc.seed, judge=model, external=external,
                         gold=resolve_judge(gold_name), precision=sc.spec.precision)
    settings = for_scorer(cfg.health, registered=external is not None)
    return Watch(settings, check, cfg.check_every, sc.dir / "healthy"), prompts


def finding_record(finding: Finding, action: str) -> HealthFinding:
    detector = BY_NAME[finding.detector]
    return HealthFinding(detector=finding.detector, failure=detector.failure, action=action,
                         iteration=finding.iteration, onset=finding.onset, advice=detector.advice,
                         last_healthy=finding.last_healthy, message=finding.message,
                         evidence=finding.evidence)


class HealthLog:
    """The ppo stage's ``on_verdict``: records each check and announces each finding."""

    def __init__(self, sc: StageContext, watch: Watch, prompts: list[str]):
        self.sc, self.watch, self.prompts = sc, watch, prompts

    def __call__(self, verdict: Verdict) -> None:
        if verdict.check is not None:
            self._check(verdict.check)
        for finding in verdict.findings:
            self._finding(finding)

    def _check(self, answers: CheckAnswers) -> None:
        rows = answers.rows(self.prompts)
        self.sc.log_table(pd.DataFrame(rows), f"checks/iter_{answers.iteration:05d}.json",
                          spooled=True)
        if in_prefect_run():
            from prefect.artifacts import create_table_artifact

            create_table_artifact(key=ARTIFACT_KEY, table=rows[:SHOWN_ANSWERS],
                                  description=f"ppo: held-out answers at iteration "
                                  f"{answers.iteration}")

    def findings(self, final: bool = False) -> list[HealthFinding]:
        """Every finding so far, a resume's earlier ones too (``final``: whether each stands)."""
        monitor = self.watch.monitor
        standing = monitor.standing() if final else {}
        return [finding_record(f, monitor.action(f)).model_copy(
            update={"stands": standing.get(f.detector)}) for f in monitor.findings]

    def _finding(self, finding: Finding) -> None:
        found = self.findings()
        record = next(f for f in found if f.detector == finding.detector)
        log.warning("ppo: %s", record.line())
        tags = {HEALTH_FLAGS_TAG: ",".join(f.detector for f in found),
                HEALTH_PREFIX + finding.detector: record.message[:5000]}
        # the whole table each time (a spooled table replaces the file the run holds)
        table = pd.DataFrame([{**f.model_dump(exclude={"evidence"}),
                               "evidence": json.dumps(f.evidence)} for f in found])
        for parent in (False, True):  # spooled: a finding during an outage waits with the rest
            self.sc.set_tags(tags, parent=parent, spooled=True)
            self.sc.log_table(table, "health.json", parent=parent, spooled=True)
        run = self.sc.run
        if not (in_prefect_run() or prefect_api_url()[0]):
            return  # a torchrun rank of a run on Prefect's temporary API: nobody to tell
        emit(UNHEALTHY, RUN_RESOURCE + run.parent_run_id, f"ppo: {record.failure}",
             {DETECTOR_LABEL: finding.detector},
             {"detector": finding.detector, "failure": record.failure,
              "iteration": finding.iteration, "action": record.action,
              "message": record.message, "advice": record.advice,
              "evidence": finding.evidence, "parent_run_id": run.parent_run_id})

    def record(self, trainer) -> HealthRecord:
        """The stage's health record; tags a stop, or no finding."""
        stopped = trainer.stopped
        record = HealthRecord(checks=len(self.watch.monitor.history.checks),
                              findings=self.findings(final=True),
                              stopped_by=None if stopped is None else stopped.detector,
                              restored_iteration=trainer.restored_iteration)
        tags = {} if record.findings else {HEALTH_FLAGS_TAG: ""}
        if stopped is not None:
            kept = "the policy as it was" if trainer.restored_iteration is None else \
                f"the policy of iteration {trainer.restored_iteration} (its last healthy check)"
            text = (f"stopped at iteration {stopped.iteration} by {stopped.detector}: "
                    f"{stopped.message}; kept {kept}")
            tags = {HEALTH_STOPPED_TAG: text[:5000]}
        for parent in (False, True) if tags else ():
            self.sc.set_tags(tags, parent=parent, spooled=True)
        return record
