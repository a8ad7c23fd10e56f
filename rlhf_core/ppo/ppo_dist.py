"""Data-parallel PPO: :class:`DataParallelPPO` shards the rollout batch by whole prompt groups;
every rank draws the same prompts and minibatch order and weights its micro-batches by their
share of the global minibatch's tokens, so the update is the 1-process one. Only rank 0 logs
and saves.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager

import torch
import torch.distributed as dist

from rlhf_core.models.models import PPOModels
from rlhf_core.parallel.distributed import DataParallel
from rlhf_core.parallel.fsdp import FullOptimizer, Sharded, shard
from rlhf_core.parallel.global_stats import (
    all_reduce_max,
    all_reduce_sum,
    global_masked_var,
    global_weighted_means,
)
from rlhf_core.ppo.rollout import Experience
from rlhf_core.ppo.trainer import PPOTrainer

# identical on every rank: not averaged (an average could add a rounding error)
SHARED_KEYS = ("lr", "episode", "objective/kl_coef")
SUMMED_KEYS = ("val/num_eos_tokens", "throughput/tokens_per_s")
MAX_KEYS = ("response/length_max",)  # the longest over every rank's shard


def shard_rows(batch: int, k: int, world: int, rank: int) -> torch.Tensor:
    """The rows of a ``batch`` = G * k batch that ``rank`` holds: a contiguous slice of whole
    groups of k -> [rows] long."""
    groups = torch.tensor_split(torch.arange(batch // k), world)[rank]
    return (groups[:, None] * k + torch.arange(k)).reshape(-1)


class DataParallelPPO(PPOTrainer):
    """:class:`PPOTrainer` on one rank of ``dp``; ``seed`` makes the per-rank sampling seeds.
    Every rank passes the same other arguments."""

    def __init__(self, models: PPOModels, *, dp: DataParallel, seed: int, **kwargs):
        super().__init__(models, **kwargs)
        groups = self.cfg.rollout_batch_size // self.cfg.samples_per_prompt
        if groups < dp.world:
            raise ValueError(
                f"data-parallel PPO needs a prompt per rank: ppo.rollout_batch_size "
                f"({self.cfg.rollout_batch_size}) / ppo.samples_per_prompt "
                f"({self.cfg.samples_per_prompt}) = {groups} prompts < model.nproc ({dp.world})")
        self.dp, self.seed, self.world_size = dp, seed, dp.world
        self.sharded: list[Sharded] = []
        if dp.parallel != "fsdp":
            self.policy_net = dp.wrap(self.policy)  # parameters shared with self.policy
            self.value_net = None if self.value_model is None else dp.wrap(self.value_model)
            self.train_step.no_sync = self._no_sync
            return
        # fsdp: train sharded copies; after each update their full weights are gathered back
        # for the next rollout
        self.policy_net = shard(self.policy, dp.device, dp.world, home_on_device=True)
        self.value_net = None if self.value_model is None else shard(
            self.value_model, dp.device, dp.world, home_on_device=True)
        pairs = [(self.policy, self.policy_net), (self.value_model, self.value_net)]
        self.sharded = [Sharded(home, net, everywhere=True) for home, net in pairs
                        if net is not None]
        self.optimise(self.policy_net, self.value_net, self.train_step.precision)
        nets = torch.nn.ModuleDict({"policy": self.policy_net})
        if self.value_net is not None:
            nets["value"] = self.value_net
        self.saved_optimizer = FullOptimizer(nets, self.optimizer)

    @contextmanager
    def _no_sync(self):
        """Accumulate micro-batch gradients locally (both models); the last one all-reduces."""
        with ExitStack() as stack:
            for net in (self.policy_net, self.value_net):
                if net is not None:
                    stack.enter_context(net.no_sync())
            yield

    # -- rollout ----------------------------------------------------------------------------
    def next_prompts(self) -> torch.Tensor:
        """This rank's groups of the global batch (drawn alike on every rank)."""
        prompts = super().next_prompts()
        mine = shard_rows(prompts.shape[0], self.cfg.samples_per_prompt, self.dp.world,
                          self.dp.rank)
        self.prompt_rows = [self.prompt_rows[i] for i in mine.tolist()]
        return prompts[mine]

    def step(self):
        # sampling noise: per rank and iteration, so a resumed run samples what it would have
        torch.manual_seed((self.seed * 1_000_003 + self.iteration) * 1009 + self.dp.rank)
        return super().step()

    # -- update -----------------------------------------------------------------------------
    def update(self, exp: Experience) -> dict[str, float]:
        """PPOTrainer.update over the global batch (``exp`` is this rank's shard); stats are
        summed over the ranks, each already weighted by its share."""
        stats = super().update(exp)
        for pair in self.sharded:  # fsdp: the next rollout samples with the full weights
            pair.gather()
        keys = sorted(stats)
        return dict(zip(keys, all_reduce_sum(torch.tensor([stats[k] for k in keys])).tolist()))

    def global_lengths(self, local: torch.Tensor) -> torch.Tensor:
        """Every rank's response lengths in rank order; notes where each rank's shard starts."""
        every: list = [None] * self.dp.world
        dist.all_gather_object(every, local.tolist())
        self._starts = torch.tensor([0] + [len(shard) for shard in every]).cumsum(0)
        return torch.tensor([n for shard in every for n in shard])

    def minibatch_rows(self, idx: torch.Tensor) -> list[tuple[torch.Tensor, float]]:
        """This rank's micro-batches of minibatch ``idx``, padded with weight-0 ones (under
        fsdp, to the most any rank runs: each forward all-gathers): every rank must join each
        all-reduce."""
        lo, hi = int(self._starts[self.dp.rank]), int(self._starts[self.dp.rank + 1])
        mine = idx[(idx >= lo) & (idx < hi)] - lo
        empty = (torch.zeros(1, dtype=torch.long), 0.0)
        chunks = super().minibatch_rows(mine) if len(mine) else [empty]
        if not self.sharded:
            return chunks
        size, starts = self.cfg.micro_batch_size, self._starts
        held = [int(((idx >= a) & (idx < b)).sum()) for a, b in zip(starts, starts[1:])]
        most = max(-(-n // size) if size and n else 1 for n in held)
        return chunks + [empty] * (most - len(chunks))

    # -- metrics ----------------------------------------------------------------------------
    def iteration_metrics(self, exp: Experience, stats: dict[str, float], rollout_s: float,
                          update_s: float) -> dict[str, float]:
        """The global batch's metrics (``stats`` from :meth:`update` are global already)."""
        local = super().iteration_metrics(exp, stats, rollout_s, update_s)
        apart = set(stats) | set(SHARED_KEYS) | set(MAX_KEYS) | \
            {"val/explained_variance", "objective/advantage_abs_mean"}
        out = self.dp.global_metrics({k: v for k, v in local.items() if k not in apart},
                                     exp.responses.shape[0], SUMMED_KEYS)
        maxed = [k for k in MAX_KEYS if k in local]
        out.update(zip(maxed, all_reduce_max(torch.tensor([local[k] for k in maxed])).tolist()))
        mask = exp.response_mask
        abs_sum, tokens = all_reduce_sum(torch.stack([(exp.advantages.abs() * mask).sum(),
                                                      mask.sum().to(exp.advantages.dtype)]))
        out["objective/advantage_abs_mean"] = float(abs_sum / tokens)  # a token mean
        if "val/explained_variance" in local:
            # 1 - Var(R - V) / Var(R) over the global batch's response tokens (0 if Var(R)=0)
            var_r = global_masked_var(exp.returns, mask, unbiased=False)
            out["val/explained_variance"] = 0.0 if var_r == 0 else float(
                1 - global_masked_var(exp.returns - exp.values, mask, unbiased=False) / var_r)
        out.update({k: local[k] for k in (*SHARED_KEYS, *stats) if k in local})
        return {k: out[k] for k in local}

    # -- checkpoints: every rank restores (fsdp: into its shards); rank 0 writes (fsdp: the
    # optimizer state every rank gathers) ----------------------------------------------------
    def restore(self, checkpointer):
        if not self.sharded:
            return super().restore(checkpointer)
        restored = checkpointer.restore(self.saved_optimizer, self.scheduler, self.generator,
                                        self.cfg.optim.lr)
        if restored is not None:
            for pair in self.sharded:
                pair.push()
        return restored

    def save(self, checkpointer, state: dict) -> None:
        optimizer = self.saved_optimizer.gather() if self.sharded else self.optimizer
        if self.dp.is_main:
            checkpointer.save(self.iteration, optimizer, self.scheduler, self.generator, state)

    # -- the loop ---------------------------------------------------------------------------
    def agree_to_stop(self, stop: bool) -> bool:
        """Every rank stops when one does."""
        return bool(all_reduce_max(torch.tensor([float(stop)]))[0] > 0)

    def train(self, on_iteration=None, progress: bool = True, monitor=None,
              checkpointer=None, watch=None, on_verdict=None) -> dict:
        """PPOTrainer.train on every rank; ``monitor`` is averaged over the global batch, and
        only rank 0 reports, shows progress and saves."""
        main = self.dp.is_main
        if watch is not None:
            watch.writes = main
        if monitor is not None:
            local_monitor = monitor

            def monitor(prompts, responses, has_eos):
                return global_weighted_means(local_monitor(prompts, responses, has_eos),
                                             len(prompts))
        return super().train(on_iteration if main else None, progress and main, monitor,
                             checkpointer, watch, on_verdict if main else None)


def make_trainer(models: PPOModels, *, dp: DataParallel | None = None, seed: int = 0,
                 **kwargs) -> PPOTrainer:
    """PPOTrainer in one process (``dp`` None), else DataParallelPPO on a rank of ``dp``."""
    if dp is None:
        return PPOTrainer(models, **kwargs)
    return DataParallelPPO(models, dp=dp, seed=seed, **kwargs)
