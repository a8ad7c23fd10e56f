"""PPO for language models, the ppo stage's loop (README § Sources [PPO], [InstructGPT]):
sample prompts -> ``make_experience`` -> K epochs over M minibatches of clipped losses ->
metrics with TRL's names. What it optimises is rlhf_core/ppo/algorithms.py.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import torch

from rlhf_core.config import PPOConfig
from rlhf_core.faults import crash_point
from rlhf_core.masked import masked_mean, trusted_masks
from rlhf_core.memory import HeapTrimmer
from rlhf_core.models.checkpoint import Checkpointer
from rlhf_core.models.data import ShuffledBatches, left_pad
from rlhf_core.models.models import PPOModels
from rlhf_core.parallel.distributed import check_world_size
from rlhf_core.ppo.algorithms import make_algorithm
from rlhf_core.ppo.compiled import CompiledBlocks
from rlhf_core.ppo.ppo_math import (
    AdaptiveKLController,
    FixedKLController,
    clipped_policy_loss,
    clipped_value_loss,
    entropy_from_log_softmax,
    log_softmax_at,
)
from rlhf_core.ppo.report import (
    GRAD_NORM_KEYS,
    IterationFn,
    MonitorFn,
    VerdictFn,
    Watcher,
    decode,
    rollout_metrics,
    sample_rows,
    weighted_sum,
)
from rlhf_core.ppo.rewards import RewardMix
from rlhf_core.ppo.rollout import (
    Experience,
    RolloutSettings,
    make_experience,
    pad_to,
    response_logits,
    response_values,
    sampling_config,
    to_autograd_tensors,
)
from rlhf_core.train.optim import build_optimizer, check_finite
from rlhf_core.train.ptx import PretrainMix
from rlhf_core.train.train_step import TrainStep

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class PPOTrainer:
    """The models, the optimizer and the prompt stream; one ``step`` per iteration (the value
    model None for a critic-free ``cfg.advantage_estimator``)."""

    def __init__(
        self, models: PPOModels, *, tokenizer: PreTrainedTokenizerBase,
        prompt_ids: Sequence[Sequence[int]], cfg: PPOConfig, norm_stats: dict[str, float],
        device: torch.device, generator: torch.Generator, divide_by_std: bool = False,
        precision: str = "fp32", pretrain_ids: Sequence[Sequence[int]] | None = None,
        rewards: RewardMix | None = None,
    ):
        """``norm_stats``: the reward normaliser's mean/std (std divides only with
        ``divide_by_std``); ``pretrain_ids``: the ptx chunks (``cfg.ptx_coef`` > 0);
        ``rewards``: the reward's sources (None: the reward model alone)."""
        policy, ref_policy, value_model, reward_model = models
        if len(prompt_ids) == 0:
            raise ValueError("PPO needs at least one prompt")
        self.algorithm = make_algorithm(cfg)
        if self.algorithm.uses_critic != (value_model is not None):
            raise ValueError(f"ppo.advantage_estimator={cfg.advantage_estimator} "
                             + ("needs a value model" if self.algorithm.uses_critic
                                else "has no critic: pass value_model=None"))
        self.policy, self.ref_policy = policy.to(device), ref_policy.to(device)
        self.value_model = value_model.to(device).train() if value_model is not None else None
        self.reward_model = reward_model.to(device)
        for frozen in (self.ref_policy, self.reward_model):
            frozen.eval().requires_grad_(False)
        self.policy.train()
        # what the update's forward runs (data parallel: DDP-wrapped or sharded copies)
        self.policy_net, self.value_net = self.policy, self.value_model
        self.tokenizer, self.cfg, self.device = tokenizer, cfg, device
        # a Sequence: a RaggedIds makes the ids of a batch's prompts when they are drawn
        self.prompt_ids, self.norm_stats, self.generator = prompt_ids, norm_stats, generator
        self.rewards = rewards or RewardMix()
        self.prompt_rows: list[int] = []  # the prompt data's row of each rollout of the batch
        self.settings = RolloutSettings(
            temperature=cfg.temperature, kl_estimator=cfg.kl_estimator,
            missing_eos_penalty=cfg.missing_eos_penalty, divide_by_std=divide_by_std,
            forward_batch_size=cfg.forward_batch_size,
            generation_batch_size=cfg.generation_batch_size,
            recompute_logprobs=precision != "fp32" or cfg.static_cache,
        )
        self.gen_config = sampling_config(tokenizer, cfg.temperature, cfg.max_new_tokens,
                                          cfg.static_cache,
                                          getattr(policy, "generation_config", None))
        self.optimise(self.policy, self.value_model, precision)
        # ppo.compile: the trained models' decoder blocks compiled for the update (static
        # shapes: prompts padded to a multiple of 16, responses to max_new_tokens)
        self.compiled = CompiledBlocks([self.policy, self.value_model]) if cfg.compile else None
        self.kl_ctl = (AdaptiveKLController(cfg.kl_coef, cfg.target_kl, cfg.kl_horizon)
                       if cfg.adaptive_kl else FixedKLController(cfg.kl_coef))
        self.iteration, self.episode = 0, 0
        self.world_size = 1  # data-parallel ranks (rlhf_core/ppo/ppo_dist.py sets it)
        # a health finding that ended PPO, and the iteration of the snapshot restored
        self.stopped: Any = None
        self.restored_iteration: int | None = None
        self.prompt_stream = ShuffledBatches(
            len(self.prompt_ids), cfg.rollout_batch_size // cfg.samples_per_prompt, generator)
        self.ptx = PretrainMix(
            pretrain_ids or [], cfg.ptx_batch_size or cfg.micro_batch_size or cfg.minibatch_size,
            tokenizer.pad_token_id, generator, device) if cfg.ptx_coef > 0 else None

    def optimise(self, policy: torch.nn.Module, value_model: torch.nn.Module | None,
                 precision: str) -> None:
        """The optimizer, its schedule and the train step over these models' parameters."""
        groups = {"policy": list(policy.parameters())}
        if value_model is not None:
            groups["value"] = list(value_model.parameters())
        params = [p for group in groups.values() for p in group]
        cfg = self.cfg
        total = cfg.iterations * cfg.ppo_epochs * cfg.num_minibatches
        self.optimizer, self.scheduler = build_optimizer(params, cfg.optim, total)
        self.train_step = TrainStep(params, self.optimizer, self.scheduler,
                                    cfg.optim.max_grad_norm, precision, self.device,
                                    name="ppo", groups=groups)

    @property
    def models(self) -> PPOModels:
        return PPOModels(self.policy, self.ref_policy, self.value_model, self.reward_model)

    # -- prompt stream ----------------------------------------------------------------------
    def next_prompts(self) -> torch.Tensor:
        """The next rollout_batch_size / k prompts, each repeated k = samples_per_prompt
        times in a row (the critic-free estimators' groups) -> [B, P] left-padded."""
        k = self.cfg.samples_per_prompt
        chosen = self.prompt_stream.take(self.cfg.rollout_batch_size // k).tolist()
        self.prompt_rows = [i for i in chosen for _ in range(k)]
        prompts = left_pad([self.prompt_ids[i] for i in self.prompt_rows],
                           self.tokenizer.pad_token_id)
        if self.cfg.static_cache or self.cfg.compile:
            # widths rounded up to 16: few shapes, so compiled code is rarely rebuilt
            prompts = torch.nn.functional.pad(prompts, (-prompts.shape[1] % 16, 0),
                                              value=self.tokenizer.pad_token_id)
        return prompts

    # -- one iteration ----------------------------------------------------------------------
    def step(self) -> tuple[dict[str, float], Experience]:
        t0 = time.perf_counter()
        prompts = self.next_prompts().to(self.device)
        # eval mode in the rollout (dropout is off either way): no activation checkpointing,
        # so generate keeps its KV cache
        for model in self.trained.values():
            model.eval()
        with self.train_step.autocast():
            exp = make_experience(
                self.models, prompts, self.tokenizer, self.gen_config,
                kl_coef=self.kl_ctl.value, norm_stats=self.norm_stats, settings=self.settings,
                algorithm=self.algorithm, mix=self.rewards, prompt_rows=self.prompt_rows,
                group=self.cfg.samples_per_prompt, iteration=self.iteration + 1,
            )
        for model in self.trained.values():
            model.train()
        exp = to_autograd_tensors(exp)
        check_finite("reward-model score", exp.raw_scores, self.iteration + 1)
        crash_point(f"ppo:rollout:{self.iteration + 1}")
        t1 = time.perf_counter()
        stats = self.update(exp)
        t2 = time.perf_counter()
        self.iteration += 1
        self.episode += self.cfg.rollout_batch_size  # the global batch (= prompts' rows)
        metrics = self.iteration_metrics(exp, stats, t1 - t0, t2 - t1)
        self.kl_ctl.update(metrics["objective/kl"], self.cfg.rollout_batch_size)
        return metrics, exp

    def update(self, exp: Experience) -> dict[str, float]:
        """K epochs x M minibatches -> averaged stats; a minibatch is one optimizer step over
        micro-batches, each weighted by its share of the response tokens."""
        cfg = self.cfg
        local = exp.response_mask.sum(dim=1).cpu()  # (B_local,)
        if (local == 0).any():
            raise ValueError("PPO update: a response has no real token")
        lengths = self.global_lengths(local)  # (B,) the global batch's
        recorded: dict[str, list[tuple[float, torch.Tensor]]] = defaultdict(list)
        n_updates = 0

        def micro_batch(rows: torch.Tensor, scale: float, n_tokens: int):
            share = scale * int(local[rows].sum()) / n_tokens  # of the global minibatch
            loss, values = self.minibatch_loss(exp, rows, int(local[rows].max()))
            if self.ptx is not None:  # one pretraining micro-batch per PPO micro-batch
                ptx = self.ptx.loss(self.policy)
                loss = loss + cfg.ptx_coef * ptx
                values = {**values, "ptx/loss": ptx}
            for key, value in values.items():
                recorded[key].append((share, value.detach()))
            return loss, self.world_size * share  # DDP averages the ranks' gradients

        compiled = self.compiled.active() if self.compiled is not None else nullcontext()
        with trusted_masks(), compiled:
            for _ in range(cfg.ppo_epochs):
                order = torch.randperm(len(lengths), generator=self.generator)
                for start in range(0, len(order), cfg.minibatch_size):
                    idx = order[start: start + cfg.minibatch_size]
                    n_tokens = int(lengths[idx].sum())
                    self.train_step.run(
                        [lambda rows=rows, scale=scale, n=n_tokens: micro_batch(rows, scale, n)
                         for rows, scale in self.minibatch_rows(idx)], self.iteration + 1)
                    for group, norm in self.train_step.group_norms.items():
                        # the same on every rank: each adds its 1/world share of the mean
                        recorded[GRAD_NORM_KEYS[group]].append((1.0 / self.world_size, norm))
                    n_updates += 1
        return {key: weighted_sum(pairs, n_updates) for key, pairs in recorded.items()}

    def global_lengths(self, local: torch.Tensor) -> torch.Tensor:
        return local  # one process: its batch is the global one

    def minibatch_rows(self, idx: torch.Tensor) -> list[tuple[torch.Tensor, float]]:
        """(rows, token-share scale) of each micro-batch this process runs for minibatch
        ``idx``; one process: ``idx`` in chunks of ``cfg.micro_batch_size``, scale 1."""
        micro = self.cfg.micro_batch_size or len(idx)
        return [(idx[i: i + micro], 1.0) for i in range(0, len(idx), micro)]

    def minibatch_loss(self, exp: Experience, rows: torch.Tensor, R: int):
        """Clipped policy loss - entropy bonus (+ value loss, + the algorithm's extra loss) on
        ``rows`` (CPU indices), trimmed to their longest response ``R`` -> (loss, stats)."""
        cfg, P = self.cfg, exp.context_length
        idx = rows.to(self.device)
        policy, value_model = self.policy_net, self.value_net
        pad_id = self.tokenizer.pad_token_id
        width = cfg.max_new_tokens if self.compiled is not None else R  # static shapes

        def cut(t: torch.Tensor, value: float = 0.0) -> torch.Tensor:
            return pad_to(t[idx, :R], width, value)

        qr = pad_to(exp.query_responses[idx, : P + R], P + width, pad_id)  # prompt | response
        mask = cut(exp.response_mask, False)
        # log softmax(logits / T) once, for both the log-probs and the entropy
        logp = log_softmax_at(response_logits(policy, qr, pad_id, P), cfg.temperature)
        logprobs = logp.gather(-1, cut(exp.responses, pad_id).unsqueeze(-1)).squeeze(-1)
        pg_loss, pg_stats = clipped_policy_loss(logprobs, cut(exp.logprobs), cut(exp.advantages),
                                                mask, cfg.clip_eps)
        entropy = masked_mean(
            entropy_from_log_softmax(logp.detach() if cfg.ent_coef == 0 else logp), mask)
        loss = pg_loss - cfg.ent_coef * entropy
        stats = {"loss/policy_avg": pg_loss, "policy/entropy_avg": entropy,
                 "policy/approxkl_avg": pg_stats["approxkl"],
                 "policy/clipfrac_avg": pg_stats["clipfrac"], "val/ratio": pg_stats["ratio"],
                 "val/ratio_var": pg_stats["ratio_var"]}
        if value_model is not None:
            vpred = response_values(value_model, qr, pad_id, P)  # (b, R)
            vf_loss, vf_stats = clipped_value_loss(vpred, cut(exp.values), cut(exp.returns), mask,
                                                   cfg.clip_eps_value)
            loss = loss + cfg.vf_coef * vf_loss
            stats.update({"loss/value_avg": vf_loss, "val/clipfrac_avg": vf_stats["clipfrac"]})
        extra, extra_stats = self.algorithm.extra_loss(logprobs, cut(exp.ref_logprobs), mask,
                                                       self.kl_ctl.value)
        if extra is not None:
            loss = loss + extra
            stats.update({f"loss/{k}_avg": v for k, v in extra_stats.items()})
        return loss, stats

    def iteration_metrics(self, exp: Experience, stats: dict[str, float], rollout_s: float,
                          update_s: float) -> dict[str, float]:
        """The rollout batch's metrics, the loop's, the reward's sources' and ``stats``."""
        metrics = rollout_metrics(exp, self.cfg.max_new_tokens, self.value_model is not None)
        n_tokens = float(exp.response_mask.sum())
        metrics.update({
            "objective/kl_coef": float(self.kl_ctl.value),
            "lr": self.scheduler.get_last_lr()[0],
            "episode": float(self.episode),
            "time/rollout_s": rollout_s,
            "time/update_s": update_s,
            "throughput/tokens_per_s": n_tokens / max(rollout_s + update_s, 1e-9),
        })
        metrics.update(exp.reward_metrics)
        metrics.update(stats)
        return metrics

    # -- checkpoints ------------------------------------------------------------------------
    @property
    def trained(self) -> dict[str, torch.nn.Module]:
        """The trained models by name: the policy and any value model."""
        models = {"policy": self.policy}
        if self.value_model is not None:
            models["value"] = self.value_model
        return models

    def checkpointer(self, root, keep_last: int = 2) -> Checkpointer:
        """Saves the models and loop state every cfg.checkpoint_every iterations."""
        return Checkpointer(root, self.trained, self.cfg.checkpoint_every, keep_last, label="ppo")

    def restore(self, checkpointer: Checkpointer) -> tuple[int, dict] | None:
        """Load the latest checkpoint in place -> (iteration, loop state), or None."""
        return checkpointer.restore(self.optimizer, self.scheduler, self.generator,
                                    self.cfg.optim.lr)

    def save(self, checkpointer: Checkpointer, state: dict) -> None:
        checkpointer.save(self.iteration, self.optimizer, self.scheduler, self.generator, state)

    def _loop_state(self, last: dict, watch: Watcher | None = None) -> dict:
        state = {"iteration": self.iteration, "episode": self.episode,
                 "kl_coef": self.kl_ctl.value, **self.prompt_stream.state_dict(), "last": last,
                 "algorithm": self.algorithm.state_dict(), "world_size": self.world_size}
        if watch is not None:
            state["watch"] = watch.state_dict()
        if self.ptx is not None:
            state["ptx"] = self.ptx.state_dict()
        return state

    def _load_loop_state(self, state: dict, watch: Watcher | None = None) -> dict:
        check_world_size(state.get("world_size", 1), self.world_size)
        self.iteration, self.episode = state["iteration"], state["episode"]
        self.kl_ctl.value = state["kl_coef"]
        self.prompt_stream.load_state_dict(state)
        self.algorithm.load_state_dict(state.get("algorithm", {}))
        if watch is not None and "watch" in state:
            watch.load_state_dict(state["watch"])
        if self.ptx is not None and "ptx" in state:
            self.ptx.load_state_dict(state["ptx"])
        return state["last"]

    def agree_to_stop(self, stop: bool) -> bool:
        return stop  # one process: its own view

    def train(self, on_iteration: IterationFn | None = None, progress: bool = True,
              monitor: MonitorFn | None = None, checkpointer: Checkpointer | None = None,
              watch: Watcher | None = None, on_verdict: VerdictFn | None = None) -> dict:
        """Run the remaining iterations, resuming from ``checkpointer``. ``monitor`` adds
        metrics on the decoded rollouts (never the reward); ``watch`` runs the health checks,
        and a stop finding ends the loop with the last healthy snapshot restored."""
        from tqdm.auto import tqdm

        last: dict[str, float] = {}
        if checkpointer is not None:
            restored = self.restore(checkpointer)
            if restored is not None:
                last = self._load_loop_state(restored[1], watch)
        if watch is not None and self.iteration == 0:  # the start policy's check
            start: dict[str, float] = {}
            verdict = watch.observe(self, 0, start)
            if on_iteration and start:
                on_iteration(0, start, None)
            if on_verdict:
                on_verdict(verdict)
        bar = tqdm(total=self.cfg.iterations, initial=self.iteration, desc="ppo",
                   disable=not progress, leave=False)
        heap = HeapTrimmer()
        while self.iteration < self.cfg.iterations:
            last, exp = self.step()
            heap.tick()
            if monitor is not None:
                prompts, responses = decode(self.tokenizer, exp)
                last.update(monitor(prompts, responses, exp.has_eos.tolist()))
            verdict = watch.observe(self, self.iteration, last) if watch is not None else None
            samples = None
            if self.iteration % self.cfg.sample_every == 0 or self.iteration == 1:
                samples = sample_rows(self.tokenizer, exp, self.iteration, self.cfg.num_samples)
            if on_iteration:
                on_iteration(self.iteration, last, samples)
            if verdict is not None and on_verdict:
                on_verdict(verdict)
            bar.update(1)
            bar.set_postfix(score=f"{last['objective/scores']:.2f}",
                            kl=f"{last['objective/kl']:.2f}")
            if verdict is not None and self.agree_to_stop(verdict.stop is not None):
                # this rank's stop, or another's: the last healthy snapshot comes back
                self.stopped = verdict.stop or watch.first_stop()
                if self.stopped is not None:
                    self.restored_iteration = watch.restore_healthy(self, self.stopped)
                break
            if checkpointer is not None and checkpointer.due(self.iteration,
                                                             self.cfg.iterations):
                self.save(checkpointer, self._loop_state(last, watch))
        bar.close()
        return last
