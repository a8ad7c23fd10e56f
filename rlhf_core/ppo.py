"""Stage 6, PPO (Schulman et al. 2017) for language models, InstructGPT recipe.

Readable top to bottom: ``PPOTrainer.step`` = sample prompts -> ``make_experience`` (rollout,
scores, KL-shaped rewards, GAE) -> K epochs over M minibatches of clipped policy and value
losses -> metrics with TRL's names. Each minibatch is trimmed to its longest response, so the
update computes over real tokens only.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence

import torch

from rlhf_core.checkpoint import Checkpointer
from rlhf_core.config import PPOConfig
from rlhf_core.data import left_pad
from rlhf_core.faults import crash_point
from rlhf_core.masked import masked_mean
from rlhf_core.models import ScalarHeadModel
from rlhf_core.optim import build_optimizer, check_finite
from rlhf_core.ppo_math import (
    AdaptiveKLController,
    FixedKLController,
    clipped_policy_loss,
    clipped_value_loss,
    entropy_from_logits,
    explained_variance,
    logprobs_from_logits,
)
from rlhf_core.rollout import (
    Experience,
    RolloutSettings,
    make_experience,
    response_logits,
    response_values,
    sampling_config,
    to_autograd_tensors,
)

IterationFn = Callable[[int, dict[str, float], list[dict] | None], None]
MonitorFn = Callable[[list[str], list[str], list[bool]], dict[str, float]]


def make_kl_controller(cfg: PPOConfig):
    if cfg.adaptive_kl:
        return AdaptiveKLController(cfg.kl_coef, cfg.target_kl, cfg.kl_horizon)
    return FixedKLController(cfg.kl_coef)


class PPOTrainer:
    """Holds the four models, the optimizer and the prompt stream; one ``step`` per iteration.

    The value model is the caller's copy of the reward model (critic warm-start, SPEC stage 5);
    the reference policy is a frozen copy of the SFT policy.
    """

    def __init__(
        self, policy, ref_policy, value_model: ScalarHeadModel, reward_model: ScalarHeadModel,
        tokenizer, prompt_ids: Sequence[Sequence[int]], cfg: PPOConfig,
        norm_stats: dict[str, float], device: torch.device, generator: torch.Generator,
        divide_by_std: bool = False,
    ):
        if len(prompt_ids) == 0:
            raise ValueError("PPO needs at least one prompt")
        self.policy, self.ref_policy = policy.to(device), ref_policy.to(device)
        self.value_model, self.reward_model = value_model.to(device), reward_model.to(device)
        for frozen in (self.ref_policy, self.reward_model):
            frozen.eval().requires_grad_(False)
        self.policy.train()
        self.value_model.train()
        self.tokenizer, self.cfg, self.device = tokenizer, cfg, device
        self.prompt_ids, self.norm_stats, self.generator = list(prompt_ids), norm_stats, generator
        self.settings = RolloutSettings(
            temperature=cfg.temperature, kl_estimator=cfg.kl_estimator, gamma=cfg.gamma,
            lam=cfg.lam, whiten_rewards=cfg.whiten_rewards,
            missing_eos_penalty=cfg.missing_eos_penalty, divide_by_std=divide_by_std,
        )
        self.gen_config = sampling_config(tokenizer, cfg.temperature, cfg.max_new_tokens)
        params = list(self.policy.parameters()) + list(self.value_model.parameters())
        total = cfg.iterations * cfg.ppo_epochs * cfg.num_minibatches
        self.optimizer, self.scheduler = build_optimizer(params, cfg.optim, total)
        self.params = [p for p in params if p.requires_grad]
        self.kl_ctl = make_kl_controller(cfg)
        self.iteration, self.episode = 0, 0
        self._order, self._cursor = torch.empty(0, dtype=torch.long), 0

    # -- prompt stream ----------------------------------------------------------------------
    def next_prompts(self) -> torch.Tensor:
        """The next rollout_batch_size prompts, reshuffled each pass -> [B, P] left-padded."""
        chosen = []
        while len(chosen) < self.cfg.rollout_batch_size:
            if self._cursor >= len(self._order):
                self._order = torch.randperm(len(self.prompt_ids), generator=self.generator)
                self._cursor = 0
            chosen.append(int(self._order[self._cursor]))
            self._cursor += 1
        return left_pad([self.prompt_ids[i] for i in chosen], self.tokenizer.pad_token_id)

    # -- one iteration ----------------------------------------------------------------------
    def step(self) -> tuple[dict[str, float], Experience]:
        """Rollout + update; returns (metrics, experience)."""
        t0 = time.perf_counter()
        prompts = self.next_prompts().to(self.device)
        exp = make_experience(
            self.policy, self.ref_policy, self.value_model, self.reward_model, prompts,
            self.tokenizer, self.gen_config, self.kl_ctl.value, self.norm_stats, self.settings,
        )
        exp = to_autograd_tensors(exp)
        check_finite("reward-model score", exp.raw_scores, self.iteration + 1)
        crash_point(f"ppo:rollout:{self.iteration + 1}")
        t1 = time.perf_counter()
        stats = self.update(exp)
        t2 = time.perf_counter()
        self.iteration += 1
        self.episode += prompts.shape[0]
        metrics = self.iteration_metrics(exp, stats, t1 - t0, t2 - t1)
        self.kl_ctl.update(metrics["objective/kl"], prompts.shape[0])
        return metrics, exp

    def update(self, exp: Experience) -> dict[str, float]:
        """K epochs x M minibatches of clipped PPO updates; returns averaged stats."""
        cfg, P = self.cfg, exp.context_length
        pad_id = self.tokenizer.pad_token_id
        sums: dict[str, float] = defaultdict(float)
        n_updates = 0
        for _ in range(cfg.ppo_epochs):
            order = torch.randperm(exp.responses.shape[0], generator=self.generator)
            for start in range(0, len(order), cfg.minibatch_size):
                idx = order[start: start + cfg.minibatch_size].to(self.device)
                mask = exp.response_mask[idx]
                R = int(mask.sum(dim=1).max())  # trim to the longest response in the minibatch
                mask = mask[:, :R]
                qr = exp.query_responses[idx, : P + R]
                logits = response_logits(self.policy, qr, pad_id, P)  # (b, R, V)
                logprobs = logprobs_from_logits(logits, exp.responses[idx, :R], cfg.temperature)
                vpred = response_values(self.value_model, qr, pad_id, P)  # (b, R)
                pg_loss, pg_stats = clipped_policy_loss(
                    logprobs, exp.logprobs[idx, :R], exp.advantages[idx, :R], mask, cfg.clip_eps)
                vf_loss, vf_stats = clipped_value_loss(
                    vpred, exp.values[idx, :R], exp.returns[idx, :R], mask, cfg.clip_eps_value)
                entropy = masked_mean(entropy_from_logits(  # of the sampled distribution
                    logits.detach() if cfg.ent_coef == 0 else logits, cfg.temperature), mask)
                loss = pg_loss + cfg.vf_coef * vf_loss - cfg.ent_coef * entropy
                check_finite("ppo loss", loss, self.iteration + 1)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.optim.max_grad_norm)
                check_finite("ppo gradient norm", grad_norm, self.iteration + 1)
                self.optimizer.step()
                self.scheduler.step()
                n_updates += 1
                for key, value in (("loss/policy_avg", pg_loss), ("loss/value_avg", vf_loss),
                                   ("policy/entropy_avg", entropy),
                                   ("policy/approxkl_avg", pg_stats["approxkl"]),
                                   ("policy/clipfrac_avg", pg_stats["clipfrac"]),
                                   ("val/clipfrac_avg", vf_stats["clipfrac"]),
                                   ("val/ratio", pg_stats["ratio"]),
                                   ("val/ratio_var", pg_stats["ratio_var"])):
                    sums[key] += float(value.detach())
        return {k: v / n_updates for k, v in sums.items()}

    def iteration_metrics(self, exp: Experience, stats: dict[str, float], rollout_s: float,
                          update_s: float) -> dict[str, float]:
        """TRL's metric names (sums over tokens, means over the batch) plus ours."""
        mask = exp.response_mask
        non_score = exp.non_score_rewards.sum(1).mean()
        n_tokens = float(mask.sum())
        metrics = {
            "objective/kl": float(exp.kl.sum(1).mean()),
            "objective/entropy": float((-exp.logprobs * mask).sum(1).mean()),
            "objective/non_score_reward": float(non_score),
            "objective/rlhf_reward": float(non_score + exp.scores.mean()),
            "objective/scores": float(exp.scores.mean()),
            "objective/raw_scores": float(exp.raw_scores.mean()),
            "objective/kl_coef": float(self.kl_ctl.value),
            "val/num_eos_tokens": float(exp.has_eos.sum()),
            "val/explained_variance": float(
                explained_variance(exp.values, exp.returns, mask)),
            "response/length_mean": float(mask.sum(1).float().mean()),
            "response/eos_rate": float(exp.has_eos.float().mean()),
            "lr": self.scheduler.get_last_lr()[0],
            "episode": float(self.episode),
            "time/rollout_s": rollout_s,
            "time/update_s": update_s,
            "throughput/tokens_per_s": n_tokens / max(rollout_s + update_s, 1e-9),
        }
        metrics.update(stats)
        return metrics

    def decode(self, exp: Experience, n: int | None = None) -> tuple[list[str], list[str]]:
        """Prompt and response texts of the first n rollouts (special tokens dropped)."""
        prompts, responses = [], []
        P, pad = exp.context_length, self.tokenizer.pad_token_id
        for i in range(exp.responses.shape[0] if n is None else min(n, exp.responses.shape[0])):
            prompt = exp.query_responses[i, :P]
            prompts.append(self.tokenizer.decode(prompt[prompt != pad], skip_special_tokens=True))
            response = exp.responses[i][exp.response_mask[i]]
            responses.append(self.tokenizer.decode(response, skip_special_tokens=True))
        return prompts, responses

    def sample_rows(self, exp: Experience, n: int) -> list[dict]:
        """A few rollouts as table rows (prompt, response, scores, KL, has_eos, iteration)."""
        rows = []
        prompts, responses = self.decode(exp, n)
        for i in range(len(prompts)):
            rows.append({
                "iteration": self.iteration,
                "prompt": prompts[i],
                "response": responses[i],
                "score": float(exp.raw_scores[i]),
                "normalised_score": float(exp.scores[i]),
                "kl": float(exp.kl[i].sum()),
                "has_eos": bool(exp.has_eos[i]),
            })
        return rows

    # -- checkpoints ------------------------------------------------------------------------
    def checkpointer(self, root, keep_last: int = 2) -> Checkpointer:
        """Policy + value weights, optimizer, scheduler, RNG, prompt-stream position, KL
        coefficient and iteration counter, every cfg.checkpoint_every iterations."""
        return Checkpointer(root, {"policy": self.policy, "value": self.value_model},
                            self.cfg.checkpoint_every, keep_last, label="ppo")

    def _loop_state(self, last: dict) -> dict:
        return {"iteration": self.iteration, "episode": self.episode,
                "kl_coef": self.kl_ctl.value, "order": self._order.tolist(),
                "cursor": self._cursor, "last": last}

    def _load_loop_state(self, state: dict) -> dict:
        self.iteration, self.episode = state["iteration"], state["episode"]
        self.kl_ctl.value = state["kl_coef"]
        self._order = torch.tensor(state["order"], dtype=torch.long)
        self._cursor = state["cursor"]
        return state["last"]

    def train(self, on_iteration: IterationFn | None = None, progress: bool = True,
              monitor: MonitorFn | None = None,
              checkpointer: Checkpointer | None = None) -> dict:
        """Run the remaining iterations; on_iteration(iteration, metrics, samples|None).

        ``monitor(prompts, responses, has_eos)`` adds metrics computed on the decoded rollouts
        (e.g. a gold judge's score, for evaluation only: it never enters the reward).
        ``checkpointer`` (see :meth:`checkpointer`): resume from its latest checkpoint, save
        every N iterations.
        """
        from tqdm.auto import tqdm

        last: dict[str, float] = {}
        if checkpointer is not None:
            restored = checkpointer.restore(self.optimizer, self.scheduler, self.generator,
                                            self.cfg.optim.lr)
            if restored is not None:
                last = self._load_loop_state(restored[1])
        bar = tqdm(total=self.cfg.iterations, initial=self.iteration, desc="ppo",
                   disable=not progress, leave=False)
        while self.iteration < self.cfg.iterations:
            last, exp = self.step()
            if monitor is not None:
                prompts, responses = self.decode(exp)
                last.update(monitor(prompts, responses, exp.has_eos.tolist()))
            samples = None
            if self.iteration % self.cfg.sample_every == 0 or self.iteration == 1:
                samples = self.sample_rows(exp, self.cfg.num_samples)
            if on_iteration:
                on_iteration(self.iteration, last, samples)
            if checkpointer is not None and checkpointer.due(self.iteration,
                                                             self.cfg.iterations):
                checkpointer.save(self.iteration, self.optimizer, self.scheduler,
                                  self.generator, self._loop_state(last))
            bar.update(1)
            bar.set_postfix(score=f"{last['objective/scores']:.2f}",
                            kl=f"{last['objective/kl']:.2f}")
        bar.close()
        return last
