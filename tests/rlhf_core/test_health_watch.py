"""The watch inside the RL loop, on a tiny model: the held-out checks add metrics and change
nothing else (bit for bit), a stop ends PPO with the last healthy snapshot in the models, and
a run killed during a check resumes to the uninterrupted run's bits."""

from __future__ import annotations

import pytest
import torch

from rlhf_core.config import OptimConfig, PPOConfig, Sampling
from rlhf_core.health.dynamics import KLSpike
from rlhf_core.health.records import Detector, Finding
from rlhf_core.health.watch import HeldOutCheck, Watch
from rlhf_core.models.data import encode
from rlhf_core.models.loader import LoadSpec, load_pretrained, load_tokenizer
from rlhf_core.models.models import PPOModels
from rlhf_core.ppo.trainer import PPOTrainer

CPU = torch.device("cpu")
PROMPTS = [f"tell me about {w} :" for w in ["cats", "dogs", "rain", "sun", "trees", "the rain"]]


class Interrupt(Exception):
    pass


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_bits(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]


def trainer(model_dir, iterations: int = 6, checkpoint_every: int = 0) -> PPOTrainer:
    tok = load_tokenizer(str(model_dir))
    torch.manual_seed(0)
    policy, ref = load_pretrained(model_dir, LoadSpec()), load_pretrained(model_dir, LoadSpec())
    value, reward = load_pretrained(model_dir, LoadSpec(), "new_head"), \
        load_pretrained(model_dir, LoadSpec(), "new_head")
    cfg = PPOConfig(iterations=iterations, rollout_batch_size=4, num_minibatches=2,
                    ppo_epochs=2, max_new_tokens=6, optim=OptimConfig(lr=1e-3),
                    checkpoint_every=checkpoint_every, eval_every=1)
    return PPOTrainer(PPOModels(policy, ref, value, reward), tokenizer=tok,
                      prompt_ids=[encode(tok, p) for p in PROMPTS], cfg=cfg,
                      norm_stats={"mean": 0.0, "std": 1.0, "n": 1}, device=CPU,
                      generator=torch.Generator().manual_seed(0))


class Check(HeldOutCheck):
    """A held-out check that can be interrupted at one iteration (a kill during it)."""

    stop_at: int | None = None

    def run(self, models, tokenizer, device, iteration):
        answers = super().run(models, tokenizer, device, iteration)
        if iteration == self.stop_at:
            raise Interrupt(iteration)
        return answers


def watch(model_dir, t: PPOTrainer, folder, stop_at: int | None = None,
          judged: bool = True) -> Watch:
    """A watch with a judge (a fresh head: its best check is kept too) unless not
    ``judged``."""
    with torch.random.fork_rng():  # a loaded head draws its first weights: the RNG stays
        judge = load_pretrained(model_dir, LoadSpec(), "new_head") if judged else None
    check = Check(PROMPTS[:4], Sampling(temperature=0.7, max_new_tokens=6, batch_size=4), 7,
                  judge=judge, gold=lambda prompt, response, eos: float(len(response)))
    check.stop_at = stop_at
    return Watch(t.cfg.health, check, t.cfg.check_every, folder)


def run(t: PPOTrainer, w: Watch | None = None, checkpoints=None) -> dict[int, dict]:
    seen: dict[int, dict] = {}
    t.train(lambda i, m, s: seen.setdefault(i, dict(m)), progress=False, watch=w,
            checkpointer=None if checkpoints is None else t.checkpointer(checkpoints))
    return seen


@pytest.fixture(scope="module")
def unwatched(tiny_model_dir):
    """An unwatched run: its final weights, its metrics, its policy after 2 iterations."""
    t = trainer(tiny_model_dir)
    after: dict = {}
    seen: dict = {}

    def keep(i, m, s):
        seen[i] = dict(m)
        if i == 2:
            after["policy"] = weights(t.policy)

    t.train(keep, progress=False)
    return weights(t.policy), weights(t.value_model), seen, after["policy"]


def test_the_checks_add_metrics_and_change_nothing_else(tiny_model_dir, tmp_path, unwatched):
    policy, value, plain, _ = unwatched
    t = trainer(tiny_model_dir)
    seen = run(t, watch(tiny_model_dir, t, tmp_path / "healthy"))
    assert_same_bits(weights(t.policy), policy)
    assert_same_bits(weights(t.value_model), value)
    assert sorted(seen) == list(range(0, 7))  # iteration 0: the start policy's check
    checks = {"check/proxy_score", "check/judge_score", "check/gold_score", "check/kl",
              "check/length_mean", "check/eos_rate", "check/distinct_rate", "check/rm_drift",
              "time/check_s"}
    assert set(seen[0]) == checks and seen[0]["check/kl"] == pytest.approx(0, abs=1e-6)
    for i in range(1, 7):
        assert set(seen[i]) == set(plain[i]) | checks
        assert {k: seen[i][k] for k in plain[i] if not k.startswith("time/")
                and k != "throughput/tokens_per_s"} == \
            {k: v for k, v in plain[i].items() if not k.startswith("time/")
             and k != "throughput/tokens_per_s"}
    assert t.stopped is None


def fires_at(iteration: int, last_healthy: int) -> Detector:
    def rule(h, s):
        if h.iterations and h.iterations[-1] == iteration:
            return Finding("kl_spike", iteration, iteration, last_healthy, {"kl": 99.0},
                           "KL to the reference jumped")
        return None

    return Detector("kl_spike", "KL spike and collapse", ("objective/kl",), rule, KLSpike,
                    "lower the learning rate")


def stopping(w: Watch, detector: Detector) -> Watch:
    """``w`` watching for ``detector`` alone, with the action stop."""
    settings = w.monitor.settings
    w.monitor.settings = settings.model_copy(update={detector.name: getattr(
        settings, detector.name).model_copy(update={"action": "stop"})})
    w.monitor.watched = [detector]
    return w


def test_a_stop_ends_ppo_with_the_last_healthy_snapshot(tiny_model_dir, tmp_path, unwatched):
    *_, policy_after_2 = unwatched
    t = trainer(tiny_model_dir)
    w = watch(tiny_model_dir, t, tmp_path / "healthy", judged=False)
    stopping(w, fires_at(4, last_healthy=2))
    seen = run(t, w)
    assert sorted(seen) == [0, 1, 2, 3, 4]  # nothing after the stop
    assert t.stopped.detector == "kl_spike" and t.iteration == 4
    assert t.restored_iteration == 2
    assert_same_bits(weights(t.policy), policy_after_2)
    assert w.kept == [2, 3]  # keep_healthy 2; the check at 4 found the spike: no snapshot


def test_with_only_newer_snapshots_the_oldest_kept_is_restored(tiny_model_dir, tmp_path):
    t = trainer(tiny_model_dir)
    w = watch(tiny_model_dir, t, tmp_path / "healthy", judged=False)
    stopping(w, fires_at(5, last_healthy=0))
    run(t, w)
    assert w.kept == [3, 4] and t.restored_iteration == 3


def test_a_kill_during_a_check_resumes_bit_for_bit(tiny_model_dir, tmp_path):
    whole = trainer(tiny_model_dir, checkpoint_every=2)
    w_whole = watch(tiny_model_dir, whole, tmp_path / "a" / "healthy")
    reference = run(whole, w_whole, tmp_path / "a" / "ck")
    first = trainer(tiny_model_dir, checkpoint_every=2)
    with pytest.raises(Interrupt):
        run(first, watch(tiny_model_dir, first, tmp_path / "b" / "healthy", stop_at=3),
            tmp_path / "b" / "ck")
    second = trainer(tiny_model_dir, checkpoint_every=2)
    w_second = watch(tiny_model_dir, second, tmp_path / "b" / "healthy")
    seen = run(second, w_second, tmp_path / "b" / "ck")
    assert sorted(seen) == [3, 4, 5, 6]  # from the checkpoint of iteration 2
    assert len(w_whole.kept) == 3  # the newest two and the judge's best
    for i in (3, 4, 5, 6):
        assert seen[i]["check/judge_score"] == reference[i]["check/judge_score"]
        assert seen[i]["objective/kl"] == reference[i]["objective/kl"]
    assert_same_bits(weights(second.policy), weights(whole.policy))
    assert w_second.monitor.history.checks == w_whole.monitor.history.checks
    assert w_second.kept == w_whole.kept
    assert sorted(p.name for p in (tmp_path / "b" / "healthy").iterdir()) == \
        [f"iter_{i:08d}" for i in w_whole.kept]


def test_an_external_scorer_scores_each_checks_answers_as_the_judge(tiny_model_dir):
    """A scorer of text (a larger reward model, an LLM judge) in the judge's place: it gets
    the prompts and the answers, and its scores are the check's judge scores."""
    t = trainer(tiny_model_dir)
    seen = []

    def by_length(prompts, responses):
        seen.append((list(prompts), list(responses)))
        return [float(len(r)) for r in responses]

    sampling = Sampling(temperature=0.7, max_new_tokens=6, batch_size=4)
    check = HeldOutCheck(PROMPTS[:4], sampling, 7, external=by_length)
    answers = check.run(t.models, t.tokenizer, CPU, 0)
    assert seen == [(PROMPTS[:4], answers.responses)]
    assert answers.judge == [float(len(r)) for r in answers.responses]
    assert answers.metrics()["check/judge_score"] == pytest.approx(
        sum(answers.judge) / len(answers.judge))
    short = HeldOutCheck(PROMPTS[:4], sampling, 7, external=lambda p, r: [0.0])
    with pytest.raises(ValueError, match="gave 1 scores for 4 answers"):
        short.run(t.models, t.tokenizer, CPU, 0)
    with pytest.raises(ValueError, match="not both"):
        HeldOutCheck(PROMPTS[:4], sampling, 7, external=by_length,
                     judge=load_pretrained(tiny_model_dir, LoadSpec(), "new_head"))
