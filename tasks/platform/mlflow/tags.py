"""Every MLflow tag name the project writes or reads, grouped by what carries it (``*_PREFIX``)."""

# --- MLflow's own ------------------------------------------------------------------------
PARENT_TAG = "mlflow.parentRunId"  # a child (stage) run's parent: MLflow nests runs by it
MLFLOW_RUN_NAME_TAG = "mlflow.runName"  # the run name, read when the name column is empty
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"  # MLflow 3's UI opens runs table or GenAI view
DATASET_CONTEXT_TAG = "mlflow.data.context"  # a dataset input's role (training, evaluation...)

# --- the pipeline's parent run -----------------------------------------------------------
RUN_NAME_TAG = "rlhf.run_name"  # tracking.run_name (or the default): a resume finds it by it
CONFIG_HASH_TAG = "rlhf.config_hash"  # also marks a run as a pipeline run (`rlhf runs`)
RESUMED_CONFIG_HASH_TAG = "rlhf.resumed_config_hash"  # a resume's settings, when changed
SEED_TAG = "rlhf.seed"
GIT_COMMIT_TAG = "rlhf.git_commit"
PREFECT_FLOW_RUN_TAG = "rlhf.prefect_flow_run_id"  # `prefect flow-run retry` resumes by it
VERSION_PREFIX = "rlhf.version."  # + package: its installed version (or "absent")
INPUT_DIGEST_PREFIX = "rlhf.input_digest."  # + data role: source bytes' digest (resume checks)
DATA_DIGEST_PREFIX = "rlhf.data_digest."  # + data file: MLflow's digest of the cleaned file
HW_PREFIX = "rlhf.hw."  # + a key of rlhf_core.hardware.hardware_facts (also on stage runs)
PRECISION_TAG = "rlhf.precision"  # the compute precision model.precision resolved to, and why
VALIDATE_ONLY_TAG = "rlhf.validate_only"  # a run of `rlhf validate`
EVAL_SCORER_TAG = "rlhf.eval.scorer"  # who scored the evaluation, on which prompts
EVAL_START_SCORER_TAG = "rlhf.eval.vs_start_scorer"  # who compared policy and start
ANCESTRY_TAG = "rlhf.ancestry"  # "v1 -> v2 -> v3" (also on the registered version)

# a sweep: its shared run and every point's run
SWEEP_TAG = "rlhf.sweep_id"
SWEEP_ROLE_TAG = "rlhf.sweep_role"  # "shared": the run of the stages every point reuses
SWEEP_POINTS_TAG = "rlhf.sweep_points"  # how many points (on the shared run)
SWEEP_POINT_TAG = "rlhf.sweep_point"  # a point's settings (JSON)
SWEEP_SHARED_RUN_TAG = "rlhf.sweep_shared_run_id"

# a retrain
RETRAIN_TAG = "rlhf.retrain"  # "true"
RETRAIN_BATCHES_TAG = "rlhf.retrain.batches"  # the new batches (JSON: name, digest)
TRAINED_ON_TAG = "rlhf.trained_on"  # digests of every batch trained on (also on the version)
BATCH_SOURCES_TAG = "rlhf.batch_sources"  # where each batch came from (also on the version)
CONSUMED_TAG = "rlhf.retrain.consumed"  # the batches a finished retrain consumed (digests)
RETRAIN_CHAMPION_VERSION_TAG = "rlhf.retrain.champion_version"  # the champion it started from
JUDGE_SPLIT_RM_PAIRS_TAG = "rlhf.judge_split.rm_pairs"
JUDGE_SPLIT_JUDGE_PAIRS_TAG = "rlhf.judge_split.judge_pairs"
JUDGE_SPLIT_BATCH_PAIRS_HELD_TAG = "rlhf.judge_split.batch_pairs_held"

# the retrain gate's decision (parent run and gate run)
GATE_PREFIX = "rlhf.gate."  # + a figure of rlhf_core.eval.gate.gate_decision
GATE_DECISION_TAG = "rlhf.gate.decision"  # "promote" or "keep"
GATE_REASON_TAG = "rlhf.gate.reason"
GATE_SCORER_TAG = "rlhf.gate.scorer"  # the scorer's label (also on the registered version)
GATE_SCORER_ID_TAG = "rlhf.gate.scorer_id"  # judge, judge_model, reward_model or models:/...
GATE_GOLD_PREFIX = "rlhf.gate.gold."  # + diff_mean, ci_low, ci_high: the gold judge's figure
GATE_GOLD_DECISION_TAG = "rlhf.gate.gold.decision"
GATE_GOLD_AGREES_TAG = "rlhf.gate.gold.agrees"
COMPARE_PREFIX = "rlhf.compare."  # `rlhf compare`: the gate's figures, reason, scorer; no decision
COMPARE_RESULT_TAG = "rlhf.compare.result"  # "better" or "not better" (the second version)
COMPARE_VERSIONS_TAG = "rlhf.compare.versions"  # "v2 against v1"

# PPO's health (the ppo run and the parent run; the flags also on the registered version)
HEALTH_FLAGS_TAG = "rlhf.health.flags"  # the detectors that fired, comma-separated ("" none)
HEALTH_STOPPED_TAG = "rlhf.health.stopped"  # the finding that stopped PPO, and what was kept
HEALTH_PREFIX = "rlhf.health."  # + a detector's name: its finding, one sentence
BASE_MODEL_TAG = "rlhf.base_model"  # the base model a registered version was trained from
TAX_OVER_TAG = "rlhf.tax.over_budget"  # why the policy's alignment tax is over budget

# --- stage runs --------------------------------------------------------------------------
STAGE_TAG = "rlhf.stage"  # which stage a child run is
OUTPUT_TAG = "rlhf.output"  # a finished stage's output record (JSON): a re-run skips it
TOKENIZER_PREFIX = "rlhf.tokenizer."  # + a tokenizer fact (validate)
VALIDATION_REUSED_TAG = "rlhf.validation.reused"  # validate: the key of the passed one reused
CRITIC_SKIPPED_TAG = "rlhf.critic_skipped"  # why no critic was made
CRITIC_SOURCE_TAG = "rlhf.critic_source"  # the model the critic starts from
REWARD_SOURCE_PREFIX = "rlhf.reward_source."  # + source name: what identifies it (resume checks)
# a stage routed to another machine (tasks/platform/prefect/remote.py)
ROUTED_OUTPUT_TAG = "rlhf.routed.output"  # its output record, written by the other machine
ROUTED_FLOW_RUN_TAG = "rlhf.routed.flow_run"  # the Prefect flow run that ran it
ROUTED_HOST_TAG = "rlhf.routed.host"
NODES_TAG = "rlhf.nodes"  # a multi-node torchrun stage's nodes (JSON)

# --- registered versions (lineage; the register stage) -----------------------------------
PIPELINE_RUN_TAG = "rlhf.parent_run_id"  # the pipeline (parent) run the version came from
STARTED_FROM_TAG = "rlhf.started_from"  # "sft", or the champion a retrain started from
GATE_TAG = "rlhf.gate"  # the retrain gate's reason
CHAMPION_VERSION_TAG = "rlhf.champion_version"  # the champion a retrain started from
LINEAGE_BATCHES_TAG = "rlhf.batches"  # the retrain's new batches (digests)
# the register stage's champion decision and its reason (also on the register run)
REGISTER_DECISION_TAG = "rlhf.register.decision"
REGISTER_REASON_TAG = "rlhf.register.reason"
CHAMPION_SINCE_TAG = "rlhf.champion_since"  # on a version that became champion: how, why
# a person's sign-off of a retrain's candidate (retrain.approval: required): on the candidate
# version and on its round's parent run
APPROVAL_STATUS_TAG = "rlhf.approval.status"  # pending, approved, rejected or timed-out
APPROVAL_DEADLINE_TAG = "rlhf.approval.deadline"  # ISO UTC: no answer by then keeps champion
APPROVAL_BY_TAG = "rlhf.approval.by"  # the Prefect or MLflow login that answered, else OS user
APPROVAL_AT_TAG = "rlhf.approval.at"  # when the answer came (ISO UTC)
APPROVAL_REASON_TAG = "rlhf.approval.reason"
APPROVAL_VIA_TAG = "rlhf.approval.via"  # prefect-ui, cli or timeout
APPROVAL_VERSION_TAG = "rlhf.approval.version"  # on the round's run: its candidate's version
APPROVAL_FLOW_RUN_TAG = "rlhf.approval.flow_run_id"  # the Prefect flow run waiting for it
APPROVAL_ANSWER_PARAM = "rlhf.approval.answer"  # a param, set once: of two answers one is kept
ALIAS_LOG_TAG = "rlhf.alias_log"  # on the registered model: its last alias moves (JSON lines)


def stage_run_tag(stage: str) -> str:
    """``rlhf.<stage>_run_id``: the run of ``stage`` a registered version came from."""
    return f"rlhf.{stage}_run_id"


SFT_RUN_TAG = stage_run_tag("sft")
REWARD_MODEL_RUN_TAG = stage_run_tag("reward_model")
PPO_RUN_TAG = stage_run_tag("ppo")

# --- collection runs (`rlhf collect`) ----------------------------------------------------
COLLECTION_TAG = "rlhf.collection"  # the collection's id
COLLECTION_POOL_DIGEST_TAG = "rlhf.collection.pool_digest"  # later collections skip its prompts
COLLECTION_POOL_TAG = "rlhf.collection.pool"  # the prompt pool's name
COLLECTION_POLICY_TAG = "rlhf.collection.policy"  # <registered name>/<version>
COLLECTION_FILE_TAG = "rlhf.collection.file"  # the labelling file
COLLECTION_LABEL_STUDIO_TAG = "rlhf.collection.label_studio"  # its tasks' project page (no login)
PULLED_ALL_TAG = "rlhf.collection.pulled_all"  # `rlhf gc`: every pair pulled (its count)
POLICY_VERSION_INPUT_TAG = "rlhf.policy_version"  # input tag of the labelling file's dataset

# --- label-import runs (`rlhf label import`) ---------------------------------------------
LABELS_BATCH_TAG = "rlhf.labels.batch"  # digest of the labelled file
LABELS_FILE_TAG = "rlhf.labels.file"
LABELS_COLLECTIONS_TAG = "rlhf.labels.collections"  # the collections its rows came from (JSON)
LABELS_DECISION_TAG = "rlhf.labels.decision"  # "accepted" or "quarantined"
LABELS_REASON_TAG = "rlhf.labels.reason"
LABELS_PREFERENCE_DIGEST_TAG = "rlhf.labels.preference_digest"  # the batch it wrote
LABELS_SOURCE_TAG = "rlhf.labels.source"  # "label-studio" for a pull (else a file import)
LABELS_HELD_BACK_TAG = "rlhf.labels.held_back"  # labellers whose votes were dropped: {who: why}
LABELS_SEED_TAG = "rlhf.labels.seed"  # `rlhf demo-batch`: the seed the demo judge labelled with
