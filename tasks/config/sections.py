"""The pipeline's own config sections (``retrain:``, ``collect:``, the demo, tracking and
routing); the stages' sections are rlhf_core's and data_checks'."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from data_checks.labels import LabelRules
from rlhf_core.config import REGISTERED_SCORER, Section
from rlhf_core.demo import DemoSizes

# --- the retrain loop (``retrain:``) and its gate

class ScheduleConfig(Section):  # empty in a form: no schedule (form.py FORM_RULES)
    cron: str | None = Field(None, description="Cron expression, e.g. '0 3 * * 1'.")
    timezone: str = Field("UTC", description="Time zone of the cron expression.")
    interval_s: float | None = Field(None, gt=0, description="Or: run every N seconds.")

    @model_validator(mode="after")
    def _one(self) -> ScheduleConfig:
        if (self.cron is None) == (self.interval_s is None):
            raise ValueError("retrain.schedule: set exactly one of cron / interval_s")
        return self


class GateConfig(Section):
    """Move ``champion`` only on a significant win with no guard-rail failure."""

    min_prompts: int = Field(200, ge=1, description="Held-out prompts the paired test needs.")
    num_prompts: int = Field(256, ge=1, description="Held-out prompts used (first N, fixed).")
    margin: float = Field(0.0, description="The CI's lower end must exceed this score margin.")
    confidence: float = Field(0.95, gt=0, lt=1, description="Bootstrap interval level.")
    n_bootstrap: int = Field(2000, ge=100, description="Bootstrap resamples.")
    max_eos_drop: float = Field(0.05, ge=0, description="EOS rate may fall at most this much.")
    max_kl: float = Field(25.0, gt=0, description="Cap on the challenger's KL to reference.")
    scorer: str = Field("auto", description=(
        "Who scores both policies: auto (the gold judge when the data has one, else "
        "judge_model), judge, judge_model (an RM trained on held-out pairs the PPO reward "
        "model never sees), reward_model (the new RM: biased to the challenger), or "
        "models:/<name>@<alias> (a registered pyfunc scoring prompt, response)."))
    judge_fraction: float = Field(0.2, gt=0, lt=1, description=(
        "judge_model: share of the preference pairs (by hash) held out to train it."))
    judge_epochs: float | None = Field(None, gt=0, description=(
        "judge_model: epochs over its pairs (None: reward.epochs)."))
    judge_data: Literal["configured", "all"] = Field("configured", description=(
        "judge_model: train on the held-out pairs of the configured data only (a batch under "
        "test never teaches the judge that decides on it), or on every held-out pair."))

    @field_validator("scorer")
    @classmethod
    def _known_scorer(cls, v: str) -> str:
        if v in ("auto", "judge", "judge_model", "reward_model") or REGISTERED_SCORER.fullmatch(v):
            return v
        raise ValueError(f"retrain.gate.scorer {v!r}: expected auto, judge, judge_model, "
                         "reward_model or models:/<name>@<alias>")


class RetrainConfig(Section):
    watch_dir: str = Field("preference_batches", description=(
        "Folder that receives preference batches (.jsonl/.json/.csv/.parquet files)."))
    schedule: ScheduleConfig | None = Field(None, description="None: manual runs only.")
    on_overlap: Literal["skip", "wait"] = Field(
        "skip", description="A retrain that finds another running: skip it, or wait.")
    rm_data: Literal["cumulative", "new_only"] = Field(
        "cumulative", description="Reward model on the configured pairs + every consumed "
        "batch + the new ones, or on the new batches only.")
    rm_init: Literal["champion", "sft"] = Field(
        "champion", description="Warm-start the RM from the champion's RM, or from SFT.")
    policy_init: Literal["champion", "sft"] = Field(
        "champion", description="PPO starts from the champion policy, or afresh from SFT.")
    reference: Literal["champion", "sft"] = Field(
        "sft", description="PPO reference policy (KL anchor): the SFT policy, or the champion.")
    rm_epochs: float | None = Field(None, gt=0, description="Reward-model epochs of a "
                                    "retrain (None: reward.epochs).")
    ppo_iterations: int | None = Field(None, ge=1, description=(
        "PPO iterations of a retrain, which continues from the champion (None: a third of "
        "ppo.iterations, at least 1)."))
    gate: GateConfig = Field(GateConfig())
    approval: Literal["none", "required"] = Field("none", description=(
        "none: the gate's promote moves champion at once; required: the challenger is "
        "registered as candidate and champion moves only when a person approves (the flow "
        "run's form in the Prefect UI, or `rlhf approve`)."))
    approval_timeout_h: float = Field(72.0, gt=0, description=(
        "Hours a candidate waits for an answer; none by then keeps the champion "
        "(recorded as timed out)."))
    gc_batch_age_days: float = Field(30.0, ge=0, description=(
        "`rlhf gc`: consumed and quarantined batch files older than this many days are "
        "deleted (a consumed batch's copy stays on the retrain run that consumed it); a "
        "batch no retrain consumed always stays."))


# --- on-policy collection and labels coming back (``collect:``)

# The odds below are exact binomials; tests/data_checks/test_label_quality.py checks them by
# simulation.
class LabelQualityConfig(Section):
    """When a labeller's votes are dropped, and when an imported batch is quarantined."""

    min_known_agreement: float = Field(0.75, ge=0, le=1, description=(
        "Hold back a labeller, and quarantine a batch, whose answers to the known pairs are "
        "right less often (with 40 known pairs: a coin-flipper passes 0.11%, an honest "
        "labeller right 88% of the time fails 0.62%)."))
    min_known_labelled: int = Field(25, ge=1, description=(
        "Known pairs a labeller, and a batch, must answer a or b to be judged at all; fewer: "
        "held back / quarantined as 'not enough known answers' (a coin-flipper answering "
        "25 passes 0.73%)."))
    max_skip_rate: float = Field(0.5, ge=0, le=1, description=(
        "Hold back a labeller who skipped a larger share of their rows."))
    max_skip_rise: float = Field(0.25, ge=0, le=1, description=(
        "Quarantine a batch whose skip rate is this far above the median of the last "
        "accepted batches'."))
    max_rm_drop: float = Field(0.25, ge=0, le=1, description=(
        "Quarantine a batch whose agreement with the policy's reward model is this far "
        "below the median of the last accepted batches'."))

    def rules(self) -> LabelRules:
        return LabelRules(self.min_known_agreement, self.min_known_labelled, self.max_skip_rate)


class DestinationConfig(Section):
    """Where a collection's pairs go to be labelled: files, or a Label Studio project."""

    kind: Literal["files", "label_studio"] = Field("files", description=(
        "files: <out_dir>/<id>.jsonl/.csv, back with `rlhf label import`; label_studio: a "
        "project on a Label Studio server, back with `rlhf label pull`."))
    url: str | None = Field(None, description=(
        "Label Studio server (LABEL_STUDIO_URL wins; the key is LABEL_STUDIO_API_KEY, "
        "never in the config)."))
    project: str | None = Field(None, description=(
        "Project title (created when missing; None: 'rlhf <registered policy>')."))
    annotations_per_task: int = Field(1, ge=1, description=(
        "Finished annotations a task needs to count as labelled."))
    min_labelled: float = Field(0.9, gt=0, le=1, description=(
        "Share of a collection's tasks labelled before a pull makes a batch (--partial: "
        "at once)."))
    pull_schedule: ScheduleConfig | None = Field(ScheduleConfig(interval_s=600), description=(
        "When the served label-pull deployment pulls (None: manual runs only)."))


class CollectConfig(Section):
    """Sample a registered policy on fresh prompts and write a file for labellers."""

    policy: str = Field("champion", description="Registered policy version or alias sampled.")
    prompts: str | None = Field(None, description=(
        "Prompt pool file (prompt column); None: data.prompts (the demo: its training "
        "prompts)."))
    num_prompts: int = Field(192, ge=1, description="Fresh prompts per collection.")
    k: int = Field(4, ge=2, description="Responses sampled per prompt; paired (1,2), (3,4)...")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature.")
    max_new_tokens: int | None = Field(None, ge=1, description=(
        "Response token budget (None: ppo.max_new_tokens)."))
    known_pairs: int = Field(40, ge=0, description=(
        "Known-answer pairs mixed into each labelling file (demo: judged by the gold judge; "
        "else drawn from `gold`); each labeller must answer quality.min_known_labelled of "
        "them, so every labeller labels the whole file."))
    gold: str | None = Field(None, description=(
        "File of known answers (prompt, chosen, rejected) for the known-answer pairs."))
    out_dir: str = Field("to_label", description="Folder the labelling files are written to.")
    batch_size: int = Field(64, ge=1, description="Prompts sampled at once.")
    schedule: ScheduleConfig | None = Field(None, description="None: manual runs only.")
    quality: LabelQualityConfig = Field(LabelQualityConfig())
    destination: DestinationConfig = Field(DestinationConfig())


class DemoConfig(Section):
    """The embedded demo: synthetic assistant language, gold judge, tiny GPT-2 (or the data
    alone, for ``model.base_model``)."""

    enabled: bool = Field(False, description="Generate demo data and a tiny base model.")
    n_sft: int = Field(2000, ge=1, description="SFT demonstrations.")
    n_pref: int = Field(2000, ge=1, description="Preference pairs.")
    n_prompts: int = Field(1024, ge=1, description="PPO training prompts.")
    n_eval: int = Field(256, ge=1, description="Held-out evaluation prompts.")
    n_pref_eval: int = Field(500, ge=1, description="Held-out preference pairs.")
    rm_length_bias: float = Field(
        0.0, ge=0, description="The reward model's pairs are labelled by a rater who also "
        "likes longer replies, by this many points a word (the held-out pairs, the judge's, "
        "are not): a reward model with a flaw to exploit, for the health benchmark.")
    chat: bool = Field(False, description="The demo's rows as conversations (user and "
                       "assistant messages) for a chat model's template, e.g. with "
                       "model.base_model an instruct model (configs/smollm2.yaml).")
    system: str | None = Field(None, description="With demo.chat: a system message opening "
                               "every conversation (else the template's own default, if any).")
    n_layer: int = Field(2, ge=1, description="Tiny GPT-2 layers.")
    n_embd: int = Field(64, ge=8, description="Tiny GPT-2 width.")
    n_head: int = Field(4, ge=1, description="Tiny GPT-2 heads.")

    def sizes(self) -> DemoSizes:
        """How many rows of each demo file to generate."""
        return DemoSizes(n_sft=self.n_sft, n_pref=self.n_pref, n_prompts=self.n_prompts,
                         n_eval=self.n_eval, n_pref_eval=self.n_pref_eval)


class TrackingConfig(Section):
    experiment: str = Field("rlhf", description="MLflow experiment name.")
    tracking_uri: str | None = Field(None, description="MLflow URI; default "
                                     "$MLFLOW_TRACKING_URI or sqlite:///mlflow.db.")
    run_name: str | None = Field(None, description="Pipeline run name (same name resumes).")
    workdir: str = Field("rlhf_runs", description="Folder for checkpoints and prepared data.")
    registered_policy: str = Field("rlhf-policy", description="Registry name of the policy.")
    registered_reward_model: str = Field("rlhf-reward-model", description="Registry name, RM.")
    register_models: bool = Field(True, description="Register the final models.")
    promote_flagged: bool = Field(
        False, description="register: let a policy whose PPO run a health detector stopped, "
        "or flagged for reward hacking, become champion when its rule or gate says so (an "
        "explicit override; by default it stays challenger and the refusal says why).")
    progress: bool = Field(True, description="Show progress bars.")
    keep_checkpoints: int = Field(2, ge=1, description="Mid-stage checkpoints kept per stage.")
    keep_resume_state: bool = Field(
        False, description="Keep a finished run's resume state (the mid-stage checkpoints: "
        "weights, optimizer, RNG, data position) in workdir; by default it is deleted once "
        "the run is finished and its models registered. A failed or stopped run keeps it.")
    gc_keep_runs: int = Field(
        5, ge=0, description="`rlhf gc`: local folders of the newest N finished runs kept "
        "in workdir; older ones go (an alias's run and unfinished runs always stay).")
    gc_cache_age_days: float = Field(
        30.0, ge=0, description="`rlhf gc`: passed validations and tokenized chunks in the "
        "validation cache ($RLHF_VALIDATION_CACHE) unused for this many days go.")
    gc_deleted_age_days: float = Field(
        7.0, ge=0, description="`rlhf gc`: a run marked deleted in MLflow (the UI's Delete) "
        "is purged, with its stage runs and artifacts, only this many days after its "
        "deletion; until then it can be restored in the UI. 0: at the next gc.")
    gc_schedule: ScheduleConfig | None = Field(
        None, description="`rlhf serve`: run `rlhf gc --yes` on this schedule (the "
        "gc/<name> deployment); None (left empty): by hand only.")
    log_cleaned_data_max_mb: float = Field(
        32.0, ge=0, description="validate: the cleaned data files (data/<set>.jsonl, together "
        "up to this many MB) are also MLflow artifacts of the stage run, for stages on other "
        "machines; larger data is not copied into MLflow on every run (its digest, row counts, "
        "a sample and the dropped rows are; the files stay in the run folder, and other "
        "machines need that folder). 0: never copy.")
    system_metrics: bool = Field(True, description="Log CPU/memory/GPU use on the parent run.")
    system_metrics_interval_s: float = Field(5.0, gt=0, description="Sampling interval.")
    outage_limit_s: float = Field(
        600.0, gt=0, description="How long a stage trains on while the MLflow server does not "
        "answer (its writes wait in a local spool); past it the stage stops at its next "
        "checkpoint and says how to resume. A call whose answer is needed (opening or "
        "closing a stage run, recording its output, evaluate, register) waits at most this "
        "long for the server, then the run stops the same way.")


# A copy of tasks/pipeline/stages/table.py DISTRIBUTED: importing the table here would be an
# import circle and load torch before a config error is answered (a test keeps them equal).
ROUTABLE = ("sft", "reward_model", "ppo")


class RoutingConfig(Section):
    """Stages that run on another machine's Prefect worker (tasks/platform/prefect/remote.py)."""

    stages: dict[str, str] = Field(
        {}, description="Stage -> the `rlhf-stage` deployment that runs it on another "
        f"machine's worker, e.g. {{ppo: rlhf-stage/gpu}}; {', '.join(ROUTABLE)} can be routed.")
    nodes: str | None = Field(
        None, description="With model.nnodes > 1: the `rlhf-stage` deployment that starts "
        "nodes 2.. (one flow run per node), e.g. rlhf-stage/nodes.")
    start_timeout_s: float = Field(
        300.0, gt=0, description="How long a routed stage or node may wait for a worker to "
        "start it before the stage fails.")

    @field_validator("stages")
    @classmethod
    def _routable(cls, stages: dict[str, str]) -> dict[str, str]:
        for stage, name in stages.items():
            if stage not in ROUTABLE:
                raise ValueError(f"routing.stages.{stage}: only {', '.join(ROUTABLE)} can run "
                                 "on another machine")
            _deployment_name(f"routing.stages.{stage}", name)
        return stages

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, name: str | None) -> str | None:
        return None if name is None else _deployment_name("routing.nodes", name)


def _deployment_name(field: str, name: str) -> str:
    if name.count("/") != 1 or not all(name.split("/")):
        raise ValueError(f"{field}={name!r}: give a deployment as <flow name>/<deployment "
                         "name>, e.g. rlhf-stage/gpu")
    return name
