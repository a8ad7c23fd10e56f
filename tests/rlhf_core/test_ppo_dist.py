"""Data-parallel PPO: 2 gloo ranks, each holding its shard of one fixed rollout batch, make
the 1-process update of the whole batch: the same whitened advantages, updated policy and
value weights, update statistics and logged metrics within 1e-5, for GAE (rewards and
advantages whitened, micro-batches of one row, minibatches of which a rank may hold no row),
RLOO (groups of 2 kept whole on a rank, shards of 4 and 2 rows) and REINFORCE with a
global-mean baseline (shards of 3 and 2). Each rank draws its shard of the global prompt
stream. Two full 2-rank iterations (rollout, update, checkpoint) keeps the ranks' weights equal,
and only rank 0 logs and checkpoints; resumed from that checkpoint, 2 ranks redo iteration 2
to the same weights; 1 process refuses to resume it, naming model.nproc. Every test runs
with model.parallel ddp and fsdp (FSDP2 shards, full weights gathered after each update)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rlhf_core.config import OptimConfig, PPOConfig
from rlhf_core.models.data import encode
from rlhf_core.models.loader import LoadSpec, load_pretrained, load_tokenizer
from rlhf_core.models.models import PPOModels
from rlhf_core.parallel.distributed import DataParallel
from rlhf_core.ppo.ppo_dist import make_trainer, shard_rows
from rlhf_core.ppo.rollout import Experience, make_experience, to_autograd_tensors
from tests.servers import free_port

PROMPTS = ["tell me about cats :", "hello :", "please tell me about the rain and sun :",
           "tell me about dogs :", "sure the sun is nice :", "hello world :", "rain ? :"]
NORM = {"mean": 0.1, "std": 1.0, "n": 10}
CASES = {
    # Adam with a large epsilon and no clipping: a step follows the gradient's scale, so a
    # wrongly weighted shard would show in the weights
    "gae": dict(rollout_batch_size=6, num_minibatches=3, ppo_epochs=2, micro_batch_size=1,
                whiten_rewards=True, vf_coef=0.5,
                optim=OptimConfig(lr=0.1, adam_eps=1.0, max_grad_norm=1e3,
                                  schedule="constant")),
    "rloo": dict(advantage_estimator="rloo", samples_per_prompt=2, rollout_batch_size=6,
                 num_minibatches=2, ppo_epochs=1),
    "reinforce": dict(advantage_estimator="reinforce_baseline", rollout_batch_size=5,
                      num_minibatches=1, ppo_epochs=1),
}
# not the global batch's: timings, and the ratio's variance, which (as with micro-batches in
# one process) is the token-weighted mean of each micro-batch's own variance
NOT_COMPARED = ("time/rollout_s", "time/update_s", "throughput/tokens_per_s", "val/ratio_var")


def _cfg(**kw) -> PPOConfig:
    return PPOConfig(**{"iterations": 1, "max_new_tokens": 6, "temperature": 1.0,
                        "optim": OptimConfig(lr=1e-2, schedule="constant"),
                        "checkpoint_every": 1, **kw})


def _trainer(model_dir, cfg: PPOConfig, dp: DataParallel | None):
    """The same initial models, prompts and data-order generator on every rank."""
    torch.manual_seed(0)
    tok = load_tokenizer(str(model_dir))
    policy, ref = load_pretrained(model_dir, LoadSpec()), load_pretrained(model_dir, LoadSpec())
    value = load_pretrained(model_dir, LoadSpec(), "new_head") if cfg.uses_critic else None
    reward = load_pretrained(model_dir, LoadSpec(), "new_head")
    return make_trainer(PPOModels(policy, ref, value, reward), tokenizer=tok,
                        prompt_ids=[encode(tok, p) for p in PROMPTS], cfg=cfg, norm_stats=NORM,
                        device=torch.device("cpu"), generator=torch.Generator().manual_seed(0),
                        dp=dp, seed=0)


def _rollout(trainer):
    """One rollout batch of the 1-process trainer (the prompts drawn from its stream)."""
    torch.manual_seed(1)
    exp = make_experience(trainer.models, trainer.next_prompts(), trainer.tokenizer,
                          trainer.gen_config, kl_coef=trainer.kl_ctl.value,
                          norm_stats=trainer.norm_stats, settings=trainer.settings,
                          algorithm=trainer.algorithm)
    return to_autograd_tensors(exp)


def _update(trainer, exp):
    """-> (advantages, returns, update stats, metrics, trained weights)."""
    stats = trainer.update(exp)
    metrics = trainer.iteration_metrics(exp, stats, 1.0, 1.0)
    models = {"policy": trainer.policy, "value": trainer.value_model}
    weights = {f"{name}.{k}": v.detach().clone() for name, m in models.items() if m is not None
               for k, v in m.state_dict().items()}
    return exp.advantages, exp.returns, stats, metrics, weights


def slice_experience(exp: Experience, rows: torch.Tensor) -> Experience:
    """The rows ``rows`` of every per-row tensor of ``exp``."""
    return Experience(**{k: (v[rows] if isinstance(v, torch.Tensor) else v)
                         for k, v in vars(exp).items()})


def _rank_update(model_dir, name: str, exp, dp: DataParallel):
    """This rank's shard of the fixed global batch, shaped again with global statistics."""
    trainer = _trainer(model_dir, _cfg(**CASES[name]), dp)
    rows = shard_rows(exp.responses.shape[0], trainer.cfg.samples_per_prompt, dp.world,
                      dp.rank)
    prompts = trainer.next_prompts()  # the shard of the stream; moves the generator alike
    local = slice_experience(exp, rows)
    shaped = trainer.algorithm.shape(local.scores, local.kl, local.values,
                                     local.response_mask, trainer.kl_ctl.value)
    for field in ("non_score_rewards", "advantages", "returns"):
        setattr(local, field, getattr(shaped, field))
    return (rows, prompts, *_update(trainer, local))


class _Log:
    def __init__(self):
        self.calls = []

    def __call__(self, iteration, metrics, samples):
        self.calls.append(iteration)


def _full_iteration(model_dir, dp: DataParallel, ck_root: str):
    """trainer.train for 2 iterations on 2 ranks (a checkpoint after the first), with a
    judge-like monitor."""
    trainer = _trainer(model_dir, _cfg(**CASES["gae"], iterations=2), dp)
    log = _Log()
    last = trainer.train(log, progress=False, checkpointer=trainer.checkpointer(ck_root),
                         monitor=lambda p, r, e: {"judge/score": float(dp.rank)})
    return log.calls, last, {k: v.clone() for k, v in trainer.policy.state_dict().items()}


def _rank(rank: int, world: int, port: int, model_dir: str, out: str, parallel: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    torch.set_num_threads(1)
    try:
        dp = DataParallel(rank, world, torch.device("cpu"), parallel)
        fixed = torch.load(f"{out}/rollouts.pt", weights_only=False)
        results = {name: _rank_update(model_dir, name, fixed[name], dp) for name in CASES}
        results["train"] = _full_iteration(model_dir, dp, f"{out}/ck")
        results["resumed"] = _full_iteration(model_dir, dp, f"{out}/ck")  # from step 1
        torch.save(results, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()



@pytest.fixture(scope="module", params=["ddp", "fsdp"])
def runs(tiny_model_dir, tmp_path_factory, request):
    """1 process: a rollout and its update per case; then 2 ranks (model.parallel
    ``request.param``) on the same rollouts."""
    out = tmp_path_factory.mktemp(f"ppo_{request.param}")
    single, rollouts = {}, {}
    for name, kw in CASES.items():
        trainer = _trainer(tiny_model_dir, _cfg(**kw), None)
        rollouts[name] = _rollout(trainer)
        single[name] = _update(trainer, rollouts[name])
    torch.save(rollouts, out / "rollouts.pt")
    mp.spawn(_rank, args=(2, free_port(), str(tiny_model_dir), str(out), request.param),
             nprocs=2)
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]
    return single, rollouts, ranks, out


def _close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-5), (what, (a - b).abs().max())


@pytest.mark.parametrize("name", list(CASES))
def test_two_ranks_make_the_single_process_update(runs, tiny_model_dir, name):
    single, rollouts, ranks, _ = runs
    advantages, returns, stats, metrics, weights = single[name]
    global_prompts = rollouts[name].query_responses[:, : rollouts[name].context_length]
    initial = _trainer(tiny_model_dir, _cfg(**CASES[name]), None).policy.state_dict()
    assert any(not torch.equal(initial[k], weights[f"policy.{k}"]) for k in initial)
    row_sets = []
    for rank in range(2):
        rows, prompts, r_adv, r_ret, r_stats, r_metrics, r_weights = ranks[rank][name]
        row_sets.append(rows.tolist())
        assert torch.equal(prompts, global_prompts[rows])  # its shard of the global stream
        _close(r_adv, advantages[rows], "advantages")  # whitened with global statistics
        _close(r_ret, returns[rows], "returns")
        assert r_stats.keys() == stats.keys() and r_metrics.keys() == metrics.keys()
        for key, value in {**stats, **metrics}.items():
            if key not in NOT_COMPARED:
                assert {**r_stats, **r_metrics}[key] == pytest.approx(value, rel=1e-5,
                                                                     abs=1e-5), key
        for key, ref in weights.items():
            _close(r_weights[key], ref, key)
    assert sorted(row_sets[0] + row_sets[1]) == list(range(len(advantages)))
    assert all(len(r) for r in row_sets)
    k = CASES[name].get("samples_per_prompt", 1)
    assert all(len(r) % k == 0 and r[0] % k == 0 for r in row_sets)  # whole groups


def test_two_rank_iteration_checkpoints_once_and_one_process_refuses_it(runs, tiny_model_dir):
    _, _, ranks, out = runs
    (calls0, last0, policy0), (calls1, last1, policy1) = ranks[0]["train"], ranks[1]["train"]
    assert calls0 == [1, 2] and calls1 == []  # only rank 0 logs
    assert all(torch.equal(policy0[k], policy1[k]) for k in policy0)  # DDP kept them equal
    assert last0["judge/score"] == pytest.approx(last1["judge/score"])
    assert 0.0 < last0["judge/score"] < 1.0  # the global mean of rank 0's 0s and rank 1's 1s
    assert [p.name for p in (out / "ck").iterdir()] == ["step_00000001"]
    calls, _, resumed = ranks[0]["resumed"]  # iteration 2 again, from the checkpoint
    assert calls == [2]
    for key in policy0:
        _close(resumed[key], policy0[key], key)
    trainer = _trainer(tiny_model_dir, _cfg(**CASES["gae"], iterations=3), None)
    with pytest.raises(ValueError, match=r"written by 2 rank\(s\); resume it with "
                                         r"model.nproc=2 \(now 1\)"):
        trainer.train(progress=False, checkpointer=trainer.checkpointer(out / "ck"))
