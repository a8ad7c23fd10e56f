"""The pipeline config: every stage's frozen config composed into one, validated once here.

Sources, in order: the built-in demo defaults, a YAML/JSON file (``--config``), then
``--set dotted.key=value`` overrides (:func:`load_config`). The resolved config is logged
flattened as MLflow params and its hash as a tag. Tasks read their own section and never write
back; derived values are methods, not fields.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from data_checks.config import (
    DataConfig,
    ValidationConfig,
    blank_data,
    blank_data_form,
)
from data_checks.label_quality import LabelRules
from rlhf_core.config import (
    REGISTERED_SCORER,
    EvalConfig,
    ModelConfig,
    PPOConfig,
    RewardConfig,
    RewardNormConfig,
    Section,
    SFTConfig,
)
from rlhf_core.demo import DemoSizes

# --- how Prefect's Custom run form draws a section and reads it back (every section: the
# flows' ``config`` parameter, and each of the served pipeline's section parameters, Form)


def empty_input_for_none(schema: dict[str, Any]) -> None:
    """A section's JSON schema as the form draws it: each ``X | None`` field whose default is
    None becomes X's own input, ``anyOf: [X, null]`` -> X with no default; left empty it is
    None (:func:`blanks_as_none`). A form otherwise draws a choice whose None side reads
    'Property is type "None"'. A field whose default is a value keeps its None choice: None
    means something there (ppo.missing_eos_penalty)."""
    for prop in schema.get("properties", {}).values():
        options = prop.get("anyOf", [])
        if prop.get("default", 0) is not None or not any(o.get("type") == "null"
                                                          for o in options):
            continue
        rest = [o for o in prop.pop("anyOf") if o.get("type") != "null"]
        del prop["default"]
        if len(rest) == 1:
            prop.update(rest[0])
        else:
            prop["anyOf"] = rest


def defaults_in_words(schema: dict[str, Any]) -> None:
    """A section the form may leave empty as a whole (``model.lora``, a schedule): its fields
    drawn without defaults (the description says them), so an untouched section stays
    empty, i.e. None, instead of being filled with its defaults and turned on."""
    for prop in schema.get("properties", {}).values():
        if "default" in prop:
            prop["description"] = f"{prop.get('description', '')} Empty: {prop.pop('default')}."


def _no_required(schema: dict[str, Any], keep: tuple[str, ...] = ()) -> None:
    """Nothing the form must fill in: a data source's path and the data's sources are
    checked by their validators, which name what is missing."""
    required = [n for n in schema.pop("required", []) if n in keep]
    if required:
        schema["required"] = required


# the sections drawn otherwise beside empty_input_for_none, by class name
FORM_RULES = {"LoraSettings": defaults_in_words, "ScheduleConfig": defaults_in_words,
              "DataSource": _no_required, "DataConfig": _no_required}


def draw_form(schema: dict[str, Any], handler, seen: set[int] | None = None) -> None:
    """Each section ``schema`` reaches (through ``$ref``s the JSON-schema ``handler``
    resolves) drawn as the form draws it: :func:`empty_input_for_none`, then its
    ``FORM_RULES`` entry."""
    seen = set() if seen is None else seen
    node = handler.resolve_ref_schema(schema) if "$ref" in schema else schema
    if id(node) in seen:
        return
    seen.add(id(node))
    for option in schema.get("anyOf", []):
        draw_form(option, handler, seen)
    if "properties" not in node:
        return
    empty_input_for_none(node)
    FORM_RULES.get(node.get("title", ""), lambda _: None)(node)
    for prop in node["properties"].values():
        for part in (prop, *prop.get("anyOf", []), prop.get("items") or {},
                     prop.get("additionalProperties") or {}):
            if isinstance(part, dict) and ("$ref" in part or "properties" in part):
                draw_form(part, handler, seen)


def _blank(value: Any) -> bool:
    """What a form leaves empty: "", None or an empty list, or a section with nothing filled
    in."""
    if isinstance(value, Mapping):
        return all(_blank(v) for v in value.values())
    return value is None or value == "" or value == []


def _section_of(annotation: Any) -> type[Section] | None:
    """The section class a field holds (``X`` or ``X | None``), else None."""
    if isinstance(annotation, type) and issubclass(annotation, Section):
        return annotation
    found = [a for a in getattr(annotation, "__args__", ()) if isinstance(a, type)
             and issubclass(a, Section)]
    return found[0] if len(found) == 1 else None


def blanks_as_none(section: type[BaseModel], value: Any) -> Any:
    """A section as a form sends it: each field whose default is None and that the form left
    empty ("" or a section with nothing filled in) is None, in the sections inside too."""
    if not isinstance(value, Mapping):
        return value
    out = {}
    for key, given in value.items():
        field = section.model_fields.get(key)
        inner = None if field is None else _section_of(field.annotation)
        if field is not None and field.default is None and _blank(given):
            out[key] = None
        elif inner is not None:
            out[key] = blanks_as_none(inner, given)
        else:
            out[key] = given
    return out


def form_values(section: BaseModel) -> dict[str, Any]:
    """A section as a form holds it (a deployment's stored parameters): a field that is None
    where None is its default is left out, as its empty input leaves it (the server refuses
    a null for an input that is X's own); the rest as JSON."""
    dump = section.model_dump(mode="json")
    for name, field in type(section).model_fields.items():
        value = getattr(section, name)
        if value is None and field.default is None:
            dump.pop(name)
        elif isinstance(value, Section):
            dump[name] = form_values(value)
    return dump


class Form:
    """``Annotated[X, Form()]``: section X (or ``X | None``) as a flow parameter, drawn and
    read as the form does (:func:`draw_form`, :func:`blanks_as_none`); an optional one is
    drawn as X's own fields, not a choice of None."""

    def __get_pydantic_core_schema__(self, source: Any, handler) -> Any:
        from pydantic_core import core_schema

        schema = handler(source)
        section = _section_of(source)
        if section is None:
            return schema
        return core_schema.no_info_before_validator_function(
            lambda value: blanks_as_none(section, value), schema)

    def __get_pydantic_json_schema__(self, schema: Any, handler) -> dict[str, Any]:
        drawn = handler(schema)
        options = [o for o in drawn.pop("anyOf", []) if o.get("type") != "null"]
        if len(options) == 1:
            drawn.update(options[0])
        elif options:
            drawn["anyOf"] = options
        draw_form(drawn, handler)
        return drawn


# --- the retrain loop (``retrain:``) and its gate

class ScheduleConfig(Section):
    """Empty in a form: no schedule (FORM_RULES)."""

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
        if v in ("auto", "judge", "judge_model", "reward_model") or \
                REGISTERED_SCORER.fullmatch(v):
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

# Why 40 known pairs, 0.75 and 25 (binomial arithmetic, exact): a labeller passes with at least
# ceil(0.75 m) of the m >= 25 known pairs they answered a or b right. A coin-flipper (p = 0.5)
# answering all 40 passes with P(Bin(40, 0.5) >= 30) = 0.11%; skipping to any m in 25..40
# does not help: the worst, m = 25, P(Bin(25, 0.5) >= 19) = 0.73%; m < 25: held back, not
# enough known answers. An honest labeller at the demo judge's noise on known pairs (at least
# 88% right, docs/retraining.md) answering all 40 fails with P(Bin(40, 0.88) <= 29) = 0.62%.
# tests/data_checks/test_label_quality.py measures both by simulation.
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
        return LabelRules(self.min_known_agreement, self.min_known_labelled,
                          self.max_skip_rate)


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


# a learning rate at or above this, on a pretrained base in full (x10 with LoRA), is one for a
# model trained from scratch (PipelineConfig.from_scratch_rates)
FROM_SCRATCH_LR = 5e-4


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
    tracking_uri: str | None = Field(
        None, description="MLflow URI; default $MLFLOW_TRACKING_URI or sqlite:///mlflow.db."
    )
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


# The stages the table marks ``ranks`` (tasks/pipeline/stages/table.py DISTRIBUTED), copied here
# because the table imports every stage body and the bodies import this module: deriving them here
# would be an import circle, and would load torch before a config error can be answered.
# tests/tasks/pipeline/stages/test_stage_bodies.py holds the copy equal to the table.
ROUTABLE = ("sft", "reward_model", "ppo")


class RoutingConfig(Section):
    """Stages that run on another machine's Prefect worker (tasks/platform/prefect/remote.py)."""

    stages: dict[str, str] = Field(
        {}, description="Stage -> the `rlhf-stage` deployment that runs it on another "
        f"machine's worker, e.g. {{ppo: rlhf-stage/gpu}}; {', '.join(ROUTABLE)} can be routed."
    )
    nodes: str | None = Field(
        None, description="With model.nnodes > 1: the `rlhf-stage` deployment that starts "
        "nodes 2.. (one flow run per node), e.g. rlhf-stage/nodes."
    )
    start_timeout_s: float = Field(
        300.0, gt=0, description="How long a routed stage or node may wait for a worker to "
        "start it before the stage fails."
    )

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


class PipelineConfig(Section):
    """Everything one pipeline run needs."""

    seed: int = Field(0, description="Seed for every stage (data order, init, sampling).")
    demo: DemoConfig = Field(DemoConfig())
    data: DataConfig | None = Field(None, description="Data sources (every path empty: the "
                                    "demo's data).")
    model: ModelConfig = Field(ModelConfig())
    validation: ValidationConfig = Field(ValidationConfig())
    sft: SFTConfig = Field(SFTConfig())
    reward: RewardConfig = Field(RewardConfig())
    reward_norm: RewardNormConfig = Field(RewardNormConfig())
    ppo: PPOConfig = Field(PPOConfig())
    eval: EvalConfig = Field(EvalConfig())
    tracking: TrackingConfig = Field(TrackingConfig())
    retrain: RetrainConfig = Field(RetrainConfig(), description="Scheduled retraining.")
    collect: CollectConfig = Field(CollectConfig(), description="On-policy collection, labels.")
    routing: RoutingConfig = Field(RoutingConfig(), description="Stages on other machines.")

    def form_dump(self) -> dict[str, Any]:
        """The config as a deployment stores it for its form (JSON; the demo's data as every
        data path empty, which reads back as None; an empty input's None left out)."""
        dump = form_values(self)
        if self.data is None:
            dump["data"] = blank_data_form()
        return dump

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler) -> dict[str, Any]:
        """Drawn as the form draws every section (:func:`draw_form`)."""
        drawn = handler(schema)
        draw_form(drawn, handler)
        return drawn

    @model_validator(mode="before")
    @classmethod
    def _form_blanks(cls, value: Any) -> Any:
        """What a form left empty is None (:func:`blanks_as_none`)."""
        return blanks_as_none(cls, value)

    @field_validator("data", mode="before")
    @classmethod
    def _demo_when_empty(cls, value: Any) -> Any:
        """Every data path left empty (a form's untouched data section): the demo's data."""
        return None if blank_data(value) else value

    @model_validator(mode="after")
    def _nodes_started_somewhere(self) -> PipelineConfig:
        if self.model.nnodes > 1 and self.routing.nodes is None:
            raise ValueError(f"model.nnodes={self.model.nnodes} needs routing.nodes: the "
                             "rlhf-stage deployment that starts the other nodes (e.g. "
                             "rlhf-stage/nodes, served by `rlhf stage-worker` on each of them)")
        return self

    def from_scratch_rates(self) -> list[str]:
        """The learning rates that look like a model trained from scratch (the demo's tiny
        GPT-2: SFT 3e-3, PPO 5e-4) while the base is a pretrained model: ``key=value`` of
        each (empty for the demo's own model). Pretrained models fine-tune at about 1e-6 to
        5e-5 in full (README § Sources [N+]: 3e-6) and ten times that with LoRA adapters;
        a rate ten times past that range is flagged."""
        if not self.model.base_model:
            return []
        limit = FROM_SCRATCH_LR * (10 if self.model.lora is not None else 1)
        rates = {"sft.optim.lr": self.sft.optim.lr, "reward.optim.lr": self.reward.optim.lr,
                 "ppo.optim.lr": self.ppo.optim.lr}
        return [f"{k}={v:g}" for k, v in rates.items() if v >= limit]

    def short_name(self) -> str:
        """model + data + short config hash, e.g. ``pythia-160m-hh-3fa2c1`` (run names)."""
        if self.demo.enabled and not self.model.base_model:
            model = "demo-gpt2"
        else:
            model = Path(self.model.base_model.rstrip("/")).name or "model"
        data = "demo-data" if self.data is None else Path(self.data.preference.path).stem
        return f"{model}-{data}-{self.config_hash()[:6]}"

    def config_hash(self) -> str:
        """Short, stable hash of the resolved config (tag ``rlhf.config_hash``)."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'ppo': {'lr': 1}} -> {'ppo.lr': 1} (MLflow params)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out

class ConfigError(ValueError):
    """A config file or override that does not validate; the message names each field."""


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {dotted}: '{key}' is not a section")
    node[keys[-1]] = value


def parse_override(item: str) -> tuple[str, Any]:
    """'ppo.kl_coef=0.1' -> ('ppo.kl_coef', 0.1); the value is parsed as YAML."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected key=value")
    key, raw = item.split("=", 1)
    return key.strip(), yaml.safe_load(raw) if raw.strip() else ""


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping that names a key twice (the later one would
    silently win): the error gives both line numbers."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, str | int | float | bool) and key in seen:
                raise ConfigError(f"key '{key}' appears twice in one section, on lines "
                                  f"{seen[key]} and {line}: keep one of them")
            seen.setdefault(key, line)
        return super().construct_mapping(node, deep)


def read_config_file(path: Path) -> Any:
    """The parsed YAML/JSON file; ConfigError for text that is not UTF-8, not YAML, or has a
    key twice in one section."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = err.object.count(b"\n", 0, err.start) + 1
        raise ConfigError(f"{path}: not a text config file (byte 0x{err.object[err.start]:02x} "
                          f"on line {line} is not UTF-8); give a YAML or JSON file") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the config file ({err.strerror})") from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader) or {}
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML/JSON ({err})") from None


def load_config(path: str | Path | None = None, overrides: list[str] | tuple = (),
                base: dict[str, Any] | None = None) -> PipelineConfig:
    """Defaults (``base``) <- file <- overrides, validated; ConfigError names bad fields."""
    tree: dict[str, Any] = dict(base or {})
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"{p}: config file not found")
        loaded = read_config_file(p)
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p}: expected a mapping at the top level")
        tree = _merge(tree, loaded)
    given: dict[str, str] = {}
    for item in overrides:
        key, value = parse_override(item)
        _set_dotted(tree, key, value)
        given[key] = item
    try:
        return PipelineConfig.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(_error_text(err, path, given)) from None


def _error_text(err: ValidationError, path, given: dict[str, str]) -> str:
    """One line per bad field, naming the --set override that set it, else the file."""
    lines, from_file = [], False
    for e in err.errors():
        field = ".".join(str(x) for x in e["loc"])
        source = next((item for key, item in given.items()
                       if field == key or field.startswith(key + ".")), None)
        from_file |= source is None
        lines.append(f"  {field}: {e['msg']}" + (f" (from --set {source})" if source else ""))
    where = f" in {path}" if path and from_file else " (--set)" if not from_file else ""
    return f"invalid config{where}:\n" + "\n".join(lines)


SWEEPABLE = ("ppo.", "eval.")


def parse_grid(items: list[str] | tuple = ()) -> dict[str, list]:
    """['ppo.kl_coef=0.02,0.05'] -> {'ppo.kl_coef': [0.02, 0.05]} (each value parsed as YAML)."""
    grid: dict[str, list] = {}
    for item in items:
        key, raw = parse_override(item)
        values = [yaml.safe_load(v) for v in str(raw).split(",") if v.strip()] \
            if isinstance(raw, str) else [raw]
        if not values:
            raise ConfigError(f"--grid {item!r}: no values")
        grid[key] = values
    return grid


def grid_points(base: PipelineConfig, grid: dict[str, list], seeds: list[int]
                ) -> list[tuple[dict[str, Any], PipelineConfig]]:
    """One (overrides, validated config) per grid point x seed, every one checked before any
    run starts. Only RL settings (ppo.*, eval.*) and the seed may vary: anything else would
    change a stage the points share (validate, sft, reward_model, reward_norm)."""
    for key in grid:
        if not key.startswith(SWEEPABLE):
            raise ConfigError(f"--grid {key}: a sweep shares validate, sft, reward_model and "
                              f"reward_norm between points, so only ppo.* and eval.* may vary")
    if not seeds:
        raise ConfigError("--seeds: a sweep needs at least one seed")
    points = []
    for combo in itertools.product(*grid.values()):
        for seed in seeds:
            overrides = {**dict(zip(grid, combo)), "seed": seed}
            items = [f"{k}={json.dumps(v)}" for k, v in overrides.items()]
            try:
                cfg = load_config(None, items, base.model_dump(mode="json"))
            except ConfigError as err:
                raise ConfigError(f"sweep point {', '.join(items)}: {err}") from None
            points.append((overrides, cfg))
    return points
