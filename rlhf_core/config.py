"""Typed, frozen configs for the training stages, composed by tasks/config/pipeline_config.py;
each field's description is its help in Prefect's run form. Defaults follow README § Sources
[N+] and TRL (docs/differences-from-trl.md).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, create_model, field_validator, model_validator

from rlhf_core.health.detectors import DETECTORS
from rlhf_core.section import Section

# a registered MLflow pyfunc scorer, as ppo.health.scorer and retrain.gate.scorer name one
REGISTERED_SCORER = re.compile(r"models:/[^/@\s]+@[^/@\s]+")


class LoraSettings(Section):
    r: int = Field(16, ge=1, description="LoRA rank.")
    alpha: float = Field(32.0, gt=0, description="LoRA scaling numerator (alpha / r).")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the LoRA path.")
    target_modules: list[str] | str = Field(
        "all-linear", description="Modules that get adapters (peft's target_modules).")


class ModelConfig(Section):
    base_model: str = Field("", description="Hub id or local folder of the base causal LM.")
    tokenizer: str | None = Field(None, description="Tokenizer id/folder; default: base_model.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Where to train.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Parameter dtype when loading the base model.")
    trust_remote_code: bool = Field(False, description="Passed to from_pretrained.")
    torch_threads: int | None = Field(None, description="torch.set_num_threads on CPU.")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto", description="Compute precision: autocast over fp32 master weights and fp32 "
        "optimizer state (fp16 adds a loss scaler); auto = bf16 on CUDA and, for a "
        "pretrained base model, on a CPU with native bf16 units (AMX, AVX512-BF16); fp32 "
        "elsewhere.")
    attn_implementation: Literal["auto", "eager", "sdpa", "flash_attention_2"] = Field(
        "auto", description="Attention kernel passed to from_pretrained (auto: transformers' "
        "default, SDPA where the model supports it).")
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in backward (trained models; saves memory).")
    nproc: int = Field(
        1, ge=1, description="Data-parallel ranks for the SFT, reward-model and PPO stages "
        "(torchrun + DDP: gloo on CPU, nccl on CUDA, one GPU per rank); 1: in the task's "
        "own process.")
    nnodes: int = Field(
        1, ge=1, description="Machines the data-parallel stages span, model.nproc ranks on "
        "each (torchrun static rendezvous); nodes 2.. are started through the "
        "routing.nodes deployment. 1: this machine only.")
    master_addr: str | None = Field(
        None, description="With model.nnodes > 1: the address the other nodes reach this "
        "machine at (torchrun --master-addr); default: this machine's host name.")
    master_port: int = Field(
        0, ge=0, le=65535, description="With model.nnodes > 1: the rendezvous port on this "
        "machine (torchrun --master-port); 0: a free port, chosen per stage.")
    parallel: Literal["ddp", "fsdp"] = Field(
        "ddp", description="How model.nproc > 1 ranks train SFT, the reward model and PPO: "
        "ddp (a full replica per rank) or fsdp (FSDP2 fully_shard: parameters, gradients and "
        "optimizer state sharded per transformer block).")
    lora: LoraSettings | None = Field(
        None, description="Train LoRA adapters (needs peft) instead of full weights; PPO's "
        "reference and reward are the frozen bases with adapters off.")
    chat_template: str | None = Field(
        None, description="Chat template for conversational data (a Jinja string, or a file "
        "holding one), replacing the tokenizer's own; saved with the trained tokenizer.")


class OptimConfig(Section):
    lr: float = Field(1e-5, description="Peak learning rate.")
    adam_eps: float = Field(1e-5, description="AdamW epsilon (1e-5: README § Sources [RM]).")
    weight_decay: float = Field(0.0, description="AdamW weight decay.")
    warmup_ratio: float = Field(0.0, ge=0.0, lt=1.0, description="Fraction of steps warming up.")
    schedule: Literal["linear", "cosine", "constant"] = Field(
        "linear", description="Decay after warm-up.")
    max_grad_norm: float = Field(1.0, gt=0, description="Global grad-norm clip.")


class _PretrainMix(Section):
    ptx_coef: float = Field(
        0.0, ge=0, description="The pretraining mix: this many times the language-model loss "
        "on data.pretrain's text, in the same optimizer step (0: off).")
    ptx_batch_size: int | None = Field(
        None, ge=1, description="Pretraining rows per micro-batch (None, left empty: as many "
        "as the micro-batch has rows).")
    ptx_max_tokens: int = Field(128, ge=2, description="Pretraining text is cut into chunks "
                                "of at most this many tokens.")


class SFTConfig(_PretrainMix):
    epochs: float = Field(1.0, gt=0, description="Passes over the SFT data.")
    batch_size: int = Field(16, ge=1, description="Sequences per optimizer step.")
    optim: OptimConfig = Field(OptimConfig(lr=2e-5, warmup_ratio=0.03))
    loss_on: Literal["response", "all"] = Field(
        "response", description="Supervise response tokens only, or prompt too.")
    log_every: int = Field(10, ge=1, description="Log metrics every N steps.")
    checkpoint_every: int = Field(50, ge=0, description="Checkpoint every N steps (0: off).")


class RewardConfig(Section):
    epochs: float = Field(1.0, gt=0, description="Passes over the preference pairs.")
    batch_size: int = Field(16, ge=1, description="Pairs per optimizer step.")
    optim: OptimConfig = Field(OptimConfig(lr=1e-5))
    use_margin: bool = Field(False, description="Subtract a per-pair 'margin' column in the loss.")
    eval_fraction: float = Field(
        0.1, ge=0.0, lt=1.0, description="Held-out split when no preference_eval data is given.")
    log_every: int = Field(10, ge=1, description="Log metrics every N steps.")
    checkpoint_every: int = Field(50, ge=0, description="Checkpoint every N steps (0: off).")


class RewardNormConfig(Section):
    divide_by_std: bool = Field(False, description="PPO uses (r - mean) / std, not r - mean.")
    max_samples: int | None = Field(None, description="Score at most N SFT rows.")
    batch_size: int = Field(64, ge=1, description="Sequences per scoring batch.")


class _HealthSwitches(Section):
    enabled: bool = Field(
        True, description="Watch PPO while it trains: held-out checks every ppo.eval_every "
        "iterations and the detectors below; off: neither (and no judge reward model).")
    judge: bool = Field(
        True, description="Score every held-out check with an independent scorer (below): "
        "the reward_hacking detector's.")
    scorer: str = Field(
        "judge_model", description="The independent scorer: judge_model (a judge reward "
        "model trained on pairs the reward model never saw: its held-out pairs; the "
        "judge_model stage) or models:/<name>@<alias> (a registered MLflow pyfunc scoring "
        "prompt, response: a larger reward model, an LLM judge).")
    keep_healthy: int = Field(
        2, ge=1, description="Policy snapshots kept from the last healthy checks (and the "
        "judge's best one); a stop restores the newest taken before its finding's onset.")

    @field_validator("scorer")
    @classmethod
    def _known_scorer(cls, v: str) -> str:
        if v == "judge_model" or REGISTERED_SCORER.fullmatch(v):
            return v
        raise ValueError(f"ppo.health.scorer {v!r}: expected judge_model or "
                         "models:/<name>@<alias>")

    @property
    def uses_judge(self) -> bool:
        """A judge reward model scores the held-out checks (the pipeline trains one)."""
        return self.enabled and self.judge and self.scorer == "judge_model"

    @property
    def external_scorer(self) -> str | None:
        """The registered scorer (``models:/...``) of the held-out checks, if one is."""
        return self.scorer if self.enabled and self.judge and self.scorer != "judge_model" else None


FUNCTION_TARGET = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


class RewardSource(Section):
    """One source of PPO's reward (rlhf_core/ppo/rewards.py; docs/design.md § ppo)."""

    name: str = Field(..., pattern=r"^[A-Za-z0-9_.-]+$", description="The source's name "
                      "(its metrics are reward/<name>/*).")
    kind: Literal["model", "function", "registered", "http"] = Field(
        "model", description="model: the run's reward model; function: a Python function "
        "(target module:function); registered: a registered MLflow pyfunc scoring prompt, "
        "response (target models:/<name>@<alias>); http: a served one (target the "
        "invocations URL, e.g. of mlflow models serve).")
    target: str = Field("", description="What the kind names (empty for model).")
    weight: float = Field(1.0, description="Its weight in the sum.")
    timeout_s: float = Field(60.0, gt=0, description="http: seconds per request.")
    retries: int = Field(3, ge=0, description="http: tries again after a failed request, "
                         "waiting 1, 2, 4... s between.")

    @model_validator(mode="after")
    def _target(self) -> RewardSource:
        where = f"ppo.reward_sources[{self.name}]"
        checks = {"model": (lambda t: t == "", "no target (it is the run's reward model)"),
                  "function": (FUNCTION_TARGET.fullmatch, "module:function, e.g. "
                               "my_rewards:brevity"),
                  "registered": (REGISTERED_SCORER.fullmatch, "models:/<name>@<alias>"),
                  "http": (lambda t: re.fullmatch(r"https?://\S+", t), "an http(s) URL")}
        ok, expected = checks[self.kind]
        if not ok(self.target):
            raise ValueError(f"{where}: kind {self.kind} takes {expected}; got "
                             f"{self.target!r}")
        return self


# ppo.health: the switches above plus one section per detector of DETECTORS, described by
# its failure and the first paragraph of its rule's docstring
HealthConfig = create_model(
    "HealthConfig", __base__=_HealthSwitches,
    __doc__="PPO's health: held-out checks and failure detectors (docs/health.md).",
    **{d.name: (d.settings, Field(default_factory=d.settings, description=f"{d.failure}: " +
                                  " ".join((d.rule.__doc__ or "").split("\n\n")[0].split())))
       for d in DETECTORS})


class PPOConfig(_PretrainMix):
    iterations: int = Field(100, ge=1, description="PPO iterations (rollout + update).")
    rollout_batch_size: int = Field(64, ge=1, description="Prompts sampled per iteration.")
    num_minibatches: int = Field(2, ge=1, description="Minibatches per PPO epoch.")
    ppo_epochs: int = Field(4, ge=1, description="Passes over each rollout batch (K).")
    optim: OptimConfig = Field(OptimConfig(lr=3e-6, schedule="linear"))
    temperature: float = Field(0.7, gt=0, description="Sampling temperature T.")
    max_new_tokens: int = Field(53, ge=1, description="Response budget L.")
    kl_coef: float = Field(0.05, ge=0, description="Initial beta of the per-token KL penalty.")
    kl_estimator: Literal["k1", "k3"] = Field("k1", description="Per-token KL estimator.")
    adaptive_kl: bool = Field(False, description="Adapt beta toward target_kl.")
    target_kl: float = Field(6.0, gt=0, description="Adaptive controller's target KL (nats).")
    kl_horizon: int = Field(10000, ge=1, description="Adaptive controller's horizon.")
    gamma: float = Field(1.0, ge=0, le=1, description="GAE discount.")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda.")
    clip_eps: float = Field(0.2, gt=0, description="Policy ratio clip.")
    clip_eps_value: float = Field(0.2, gt=0, description="Value clip.")
    vf_coef: float = Field(0.1, ge=0, description="Value-loss coefficient.")
    ent_coef: float = Field(0.0, ge=0, description="Entropy bonus coefficient.")
    whiten_rewards: bool = Field(False, description="Whiten per-token rewards before GAE.")
    missing_eos_penalty: float | None = Field(
        -1.0, description="Score given to a response without EOS (None: no EOS trick).")
    sample_every: int = Field(10, ge=1, description="Log a sample table every N iterations.")
    num_samples: int = Field(8, ge=1, description="Rows per sample table.")
    checkpoint_every: int = Field(10, ge=0, description="Checkpoint every N iterations (0: off).")
    micro_batch_size: int | None = Field(
        None, ge=1, description="Rows per forward/backward inside a minibatch (gradient "
        "accumulation); None (left empty): the whole minibatch at once.")
    forward_batch_size: int | None = Field(
        None, ge=1, description="Rows per reference/value/reward forward in the rollout "
        "(None, left empty: the whole batch).")
    generation_batch_size: int | None = Field(
        None, ge=1, description="Prompts per generate call, grouped by prompt length "
        "(None, left empty: the whole batch).")
    static_cache: bool = Field(
        False, description="Generate with a static KV cache and a compiled decode step "
        "(CUDA; transformers' cache_implementation='static').")
    compile: bool = Field(
        False, description="torch.compile the trained models' decoder blocks for the update "
        "(static shapes: responses padded to max_new_tokens, prompts to a multiple of 16); "
        "the first iteration pays the compile time.")
    advantage_estimator: Literal["gae", "rloo", "grpo", "reinforce_baseline"] = Field(
        "gae", description="gae: PPO with a critic (value model); rloo, grpo, "
        "reinforce_baseline: critic-free, one advantage per response.")
    samples_per_prompt: int = Field(
        1, ge=1, description="Responses sampled per prompt (k); rloo and grpo need k >= 2.")
    kl_in_loss: bool = Field(
        False, description="KL as a k3 loss term (GRPO style) instead of a reward penalty.")
    whiten_advantages: bool = Field(True, description="Whiten advantages over the batch.")
    baseline_momentum: float = Field(
        0.9, ge=0, lt=1, description="reinforce_baseline: EMA momentum of the mean reward.")
    eval_every: int | None = Field(
        None, ge=1, description="A held-out check every N iterations (ppo.health); None: "
        "about ten a run (iterations / 10).")
    eval_prompts: int = Field(
        128, ge=1, description="Held-out prompts each check answers (the first of the "
        "eval_prompts data).")
    health: HealthConfig = Field(default_factory=HealthConfig,
                                 description="Held-out checks and failure detectors.")
    reward_sources: tuple[RewardSource, ...] = Field(
        (RewardSource(name="rm"),), min_length=1, description="What the reward is made of, "
        "each with a weight: the run's reward model (kind model), Python functions, "
        "registered or served reward models.")
    reward_aggregation: Literal["sum", "normalize_then_sum"] = Field(
        "sum", description="sum: the weighted sum of the sources' scores (the reward "
        "model's normalised as reward_norm measured); normalize_then_sum: each source "
        "whitened over the batch first.")

    @model_validator(mode="after")
    def _divisible(self) -> PPOConfig:
        for name in ("num_minibatches", "samples_per_prompt"):
            if self.rollout_batch_size % getattr(self, name):
                raise ValueError(f"ppo.rollout_batch_size ({self.rollout_batch_size}) must be "
                                 f"divisible by ppo.{name} ({getattr(self, name)})")
        names = [s.name for s in self.reward_sources]
        if len(set(names)) < len(names):
            raise ValueError(f"ppo.reward_sources: each name once (got {names})")
        if sum(s.kind == "model" for s in self.reward_sources) > 1:
            raise ValueError("ppo.reward_sources: the run's reward model (kind model) once")
        if self.advantage_estimator in ("rloo", "grpo") and self.samples_per_prompt < 2:
            raise ValueError(f"ppo.advantage_estimator={self.advantage_estimator} compares the "
                             "responses to one prompt: set ppo.samples_per_prompt >= 2 (it is 1)")
        return self

    @property
    def uses_critic(self) -> bool:
        """Only GAE needs a value model (and the critic warm-start stage)."""
        return self.advantage_estimator == "gae"

    @property
    def reward_model_source(self) -> RewardSource | None:
        """The run's reward model as a source of the reward, if it is one."""
        return next((s for s in self.reward_sources if s.kind == "model"), None)

    @property
    def minibatch_size(self) -> int:
        return self.rollout_batch_size // self.num_minibatches

    @property
    def check_every(self) -> int:
        """Iterations between held-out checks."""
        return self.eval_every or max(1, self.iterations // 10)


class Sampling(Section):
    """How ``rlhf_core.eval.evaluate.sample_policy`` samples: one response per prompt."""

    temperature: float = Field(gt=0, description="Sampling temperature.")
    max_new_tokens: int = Field(ge=1, description="Response token budget.")
    batch_size: int = Field(64, ge=1, description="Prompts per generation batch.")


class TaxConfig(Section):
    """The alignment tax (rlhf_core/eval/tax.py), measured where the run has a pretrained base
    (``model.base_model``)."""

    enabled: bool = Field(True, description="Measure the tax (only with a pretrained base).")
    probe: str | None = Field(
        None, description="Probe questions: a JSONL/CSV/Parquet file with a question column "
        "and an answers column (a list, or answers joined by |) (empty: the shipped probe).")
    text: str | None = Field(
        None, description="Held-out general text: a .txt file (paragraphs split at blank "
        "lines) or a JSONL/CSV/Parquet file with a text column (empty: the shipped text).")
    system: str | None = Field(
        None, description="System message before each probe question, for a chat model "
        "(empty: none, the template's own default).")
    max_new_tokens: int = Field(32, ge=1, description="Greedy answer budget per question.")
    budget: float = Field(
        0.10, ge=0, le=1, description="Probe accuracy the policy may lose against the base "
        "model (absolute); a policy over it is not made champion and never wins a retrain "
        "gate (tracking.promote_flagged or rlhf promote --flagged overrides).")


class EvalConfig(Section):
    num_prompts: int = Field(256, ge=1, description="Held-out prompts to evaluate on.")
    temperature: float = Field(0.7, gt=0, description="Sampling temperature for both policies.")
    max_new_tokens: int = Field(53, ge=1, description="Response budget.")
    batch_size: int = Field(64, ge=1, description="Prompts per generation batch.")
    judge: Literal["auto", "none", "demo", "english"] = Field(
        "auto", description="Gold judge for evaluation only: auto (the demo's judge on demo "
        "data, else none), demo, english (the real-English task's, rlhf_core/english.py), "
        "or none (no judge metrics at all).")
    num_side_by_side: int = Field(16, ge=0, description="Side-by-side samples to log.")
    tax: TaxConfig = Field(TaxConfig(), description="The alignment tax.")

    @property
    def sampling(self) -> Sampling:
        """The sampling settings both policies are evaluated with."""
        return Sampling(temperature=self.temperature, max_new_tokens=self.max_new_tokens,
                        batch_size=self.batch_size)
