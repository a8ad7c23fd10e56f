"""The health detectors' rules on hand-made traces, each against what a person reading the
numbers would say: fires on the failure's signature, silent on the healthy shape next to it;
the monitor reports a detector once and resumes from its state as if never stopped."""

from __future__ import annotations

import math
import statistics

import pytest

from rlhf_core.config import PPOConfig
from rlhf_core.health.detectors import (
    DETECTORS,
    LengthShift,
    OffDistribution,
    RewardHacking,
    length_correlation,
    length_shift,
    length_shift_stands,
    off_distribution,
    off_distribution_stands,
    reward_hacking,
    reward_hacking_stands,
)
from rlhf_core.health.dynamics import (
    CriticDivergence,
    EntropyCollapse,
    FlatReward,
    KLSpike,
    SlowRollout,
    critic_divergence,
    entropy_collapse,
    flat_reward,
    kl_spike,
    slow_rollout,
)
from rlhf_core.health.records import CheckRecord, History
from rlhf_core.health.watch import CheckAnswers, HealthMonitor


def trace(**series: list[float]) -> History:
    n = len(next(iter(series.values())))
    return History(list(range(1, n + 1)), {k: list(v) for k, v in series.items()})


# -- KL spike ---------------------------------------------------------------------------------
def kl_trace(kl: list[float], length: float | list[float] = 10.0) -> History:
    lengths = length if isinstance(length, list) else [length] * len(kl)
    return trace(**{"objective/kl": kl, "response/length_mean": lengths})


def test_kl_spike_fires_on_a_collapse_in_the_first_update_that_stays():
    found = kl_spike(kl_trace([0.0, 12.0, 11.0]), KLSpike())
    assert found is not None and found.iteration == 3 and found.onset == 2
    assert found.last_healthy == 0


def test_kl_spike_fires_on_a_jump_that_stays_and_names_the_median_before():
    kl = [1.0, 1.2, 1.1, 1.3, 1.2, 14.0, 13.0]
    assert kl_spike(kl_trace(kl[:6]), KLSpike()) is None  # one iteration
    found = kl_spike(kl_trace(kl), KLSpike())
    assert found is not None and found.iteration == 7 and found.onset == 6
    assert found.evidence == {"kl": 13.0, "kl_at_onset": 14.0, "kl_median_before": 1.2,
                              "min_jump_nats": 10.0}
    assert found.last_healthy == 4  # iteration 6's rollout came from the policy after 5
    once = KLSpike(persist=1)
    assert kl_spike(kl_trace(kl[:6]), once).iteration == 6


def test_kl_spikes_jump_is_per_response_token():
    """The same 12 nats: a spike for 10-token answers (1.2 a token), growth for 100-token
    ones (0.12 a token); a collapse to empty answers (one token: EOS) is a spike at once."""
    kl = [0.0, 12.0, 11.0]
    assert kl_spike(kl_trace(kl, 10.0), KLSpike()) is not None
    assert kl_spike(kl_trace(kl, 100.0), KLSpike()) is None
    empty = kl_spike(kl_trace([0.0, 13.1, 12.1], [9.9, 1.2, 1.0]), KLSpike())
    assert empty is not None and empty.evidence["min_jump_nats"] == pytest.approx(1.1)


@pytest.mark.parametrize("kl", [
    [0.5 * i for i in range(20)],  # steady growth
    [0.1, 0.1, 0.1, 0.1, 0.1, 0.5],  # 5x, but 0.4 nats
    [10.0, 10.0, 10.0, 10.0, 10.0, 18.0],  # +8 nats, but 1.8x
    [0.0, 0.4, 0.6, 0.9, 1.5, 2.8, 3.7, 4.3],  # a healthy start: fast, but a few nats a step
    [0.0, 0.99, 1.4, 1.94, 9.63, 3.76, 5.82, 5.85],  # a healthy demo seed: one jump, back down
    [0.0, 0.37, 0.76, 1.86, 5.91, 6.02, 4.31, 4.46],  # twice the iterations: +5.5 nats, stays
])
def test_kl_spike_stays_silent_on_growth_small_jumps_and_short_runs(kl):
    h = kl_trace(kl)
    assert all(kl_spike(History(h.iterations[:i], {k: v[:i] for k, v in h.metrics.items()}),
                        KLSpike()) is None for i in range(1, len(kl) + 1))


# -- entropy collapse -------------------------------------------------------------------------
def test_entropy_collapse_needs_patience_iterations_below_the_share():
    start, low = [1.0] * 5, [0.04] * 5
    found = entropy_collapse(trace(**{"policy/entropy_avg": start + low}), EntropyCollapse())
    assert found is not None and found.onset == 6 and found.iteration == 10
    assert entropy_collapse(trace(**{"policy/entropy_avg": start + [0.04] * 4 + [0.2]}),
                            EntropyCollapse()) is None
    collapse = [0.4, 0.016] + [0.0] * 4  # at once, in the first update
    found = entropy_collapse(trace(**{"policy/entropy_avg": collapse}), EntropyCollapse())
    assert found is not None and found.onset == 2 and found.iteration == 6
    # a healthy run's entropy falls a lot too (to a sixth in the demo), not to 5 %
    assert entropy_collapse(trace(**{"policy/entropy_avg": start + [0.15] * 30}),
                            EntropyCollapse()) is None


# -- critic divergence ------------------------------------------------------------------------
def test_critic_divergence_on_non_finite_values_at_once():
    h = trace(**{"loss/value_avg": [1.0, math.nan], "val/explained_variance": [0.5, 0.5]})
    assert critic_divergence(h, CriticDivergence()).evidence["value_loss"] != 1.0


def test_critic_divergence_on_negative_explained_variance_after_warmup():
    ev = [-1.0] + [0.8] * 5 + [-0.2] * 4
    h = trace(**{"loss/value_avg": [0.5] * 10, "val/explained_variance": ev})
    found = critic_divergence(h, CriticDivergence())
    assert found is not None and found.onset == 7
    warm = trace(**{"loss/value_avg": [0.5] * 10, "val/explained_variance": [-1.0] +
                    [0.8, -0.1, -0.2, 0.5] * 2 + [0.6]})  # warm-started: negative at first;
    assert critic_divergence(warm, CriticDivergence()) is None  # then now and then only


def test_critic_divergence_on_a_critic_that_never_fits_not_a_slow_start():
    """Explained variance hovering at zero (the benchmark's unclipped critic on rewards x100)
    is found; one that starts below zero and passes 0.1 within the window (every healthy
    seed's start) is not."""
    stuck = [0.0, -0.04, 0.0, -0.01, 0.09, 0.07, 0.01]
    found = [critic_divergence(trace(**{"loss/value_avg": [1.0] * n,
                                        "val/explained_variance": stuck[:n]}),
                               CriticDivergence()) for n in range(1, 8)]
    first = next(f for f in found if f is not None)  # as soon as 4 iterations after warmup
    assert (first.iteration, first.onset) == (5, 2) and found.index(first) == 4
    slow = [-5.2, -0.47, 0.04, 0.09, 0.24, 0.43, 0.40, 0.68]
    assert all(critic_divergence(trace(**{"loss/value_avg": [1.0] * n,
                                          "val/explained_variance": slow[:n]}),
                                 CriticDivergence()) is None for n in range(1, 9))


def test_critic_divergence_on_a_growing_value_loss_not_a_falling_one():
    falling = [3.0 / (i + 1) for i in range(20)]
    ev = [0.9] * 20
    assert critic_divergence(trace(**{"loss/value_avg": falling,
                                      "val/explained_variance": ev}), CriticDivergence()) is None
    grows = falling[:12] + [5.0, 0.2, 5.0, 5.0]  # one good iteration among the bad
    failing = ev[:12] + [0.3, 0.6, 0.3, 0.2]  # ... and the critic explains less and less
    found = critic_divergence(trace(**{"loss/value_avg": grows,
                                       "val/explained_variance": failing}), CriticDivergence())
    lowest = min(sum(grows[i:i + 4]) / 4 for i in range(1, 9))
    assert found is not None and found.evidence["value_loss_lowest"] == pytest.approx(lowest)
    assert found.evidence["value_loss_median"] == 5.0 and found.onset == 13
    # the benchmark's adaptive-KL run: the loss grows 6x when the controller moves the
    # rewards, the critic still explaining ~0.88 of the returns: fitting, not diverging
    assert critic_divergence(trace(**{"loss/value_avg": grows,
                                      "val/explained_variance": ev[:16]}),
                             CriticDivergence()) is None


def test_critic_divergence_is_silent_without_a_critic():
    assert critic_divergence(trace(**{"objective/kl": [1.0] * 20}), CriticDivergence()) is None


# -- flat reward ------------------------------------------------------------------------------
@pytest.mark.parametrize("clip, scores, fires", [
    ([0.9] * 10, [0.0] * 10, True),  # every ratio clipped, nothing learned
    ([0.9] * 10, [0.1 * i for i in range(10)], False),  # clipped a lot but improving
    ([0.01] * 10, [0.0] * 10, False),  # a healthy plateau: little clipping
])
def test_flat_reward_needs_a_saturated_clip_and_a_flat_score(clip, scores, fires):
    found = flat_reward(trace(**{"policy/clipfrac_avg": clip, "objective/scores": scores}),
                        FlatReward())
    assert (found is not None) == fires


# -- slow rollout -----------------------------------------------------------------------------
def test_slow_rollout_reads_the_share_of_time_after_the_first_iteration():
    fast_first = {"time/rollout_s": [50.0] + [1.0] * 10, "time/update_s": [1.0] * 11}
    assert slow_rollout(trace(**fast_first), SlowRollout()) is None
    slow = {"time/rollout_s": [9.0] * 11, "time/update_s": [1.0] * 11,
            "time/check_s": [math.nan] * 11}
    found = slow_rollout(trace(**slow), SlowRollout())
    assert found is not None and found.evidence["rollout_share"] == pytest.approx(0.9)
    checked = {**slow, "time/check_s": [20.0] * 11}  # the checks' time counts as time
    assert slow_rollout(trace(**checked), SlowRollout()) is None


# -- reward hacking ---------------------------------------------------------------------------
def checks(*sides: tuple[float, float], n: int = 40, kl: float = 1.0,
           drift: float | None = None) -> list[CheckRecord]:
    """Checks at iterations 0, 5, 10...: per-prompt proxy and judge scores around the given
    means (a fixed zig-zag, so the paired differences are exact and small); ``drift``: every
    check's after the start."""
    wiggle = [0.05 * ((i % 5) - 2) for i in range(n)]
    return [CheckRecord(5 * k, [p + w for w in wiggle], [j - w for w in wiggle], kl * k,
                        10.0 + k, 1.0 if k == 0 else drift) for k, (p, j) in enumerate(sides)]


def hacking_trace(cs: list[CheckRecord]) -> History:
    return History([c.iteration for c in cs[1:]], {}, cs)


def test_reward_hacking_fires_when_the_proxy_rises_and_the_judge_falls_from_its_best():
    h = hacking_trace(checks((0.0, 0.0), (1.0, 1.0), (2.0, 0.5)))
    found = reward_hacking(h, RewardHacking())
    assert found is not None and found.iteration == 10
    assert found.onset == found.last_healthy == 5  # the judge's best check
    assert found.evidence["judge_change"] == pytest.approx(-0.5)
    assert found.evidence["proxy_gain"] == pytest.approx(1.0)
    assert found.evidence["kl_then"] == 1.0 and found.evidence["kl_now"] == 2.0
    assert "from its best" in found.message


def test_reward_hacking_fires_on_a_kl_bought_gain_the_judge_does_not_confirm():
    cs = checks((0.0, 0.0), (1.0, 1.0), (2.0, 1.0))
    cs[2] = CheckRecord(10, cs[2].proxy, cs[1].judge, 12.0, 14.0)  # KL 1 -> 12
    found = reward_hacking(hacking_trace(cs), RewardHacking())
    assert found is not None and found.last_healthy == 5
    assert "did not confirm it" in found.message and found.evidence["kl_now"] == 12.0
    cs[2] = CheckRecord(10, cs[2].proxy, cs[1].judge, 5.0, 14.0)  # +4 nats: not enough
    assert reward_hacking(hacking_trace(cs), RewardHacking()) is None
    confirmed = [j + 0.5 for j in cs[1].judge]  # the judge gains too: KL well spent
    cs[2] = CheckRecord(10, cs[2].proxy, confirmed, 12.0, 14.0)
    assert reward_hacking(hacking_trace(cs), RewardHacking()) is None


@pytest.mark.parametrize("sides", [
    ((0.0, 0.0), (1.0, 1.0), (0.8, 0.5)),  # both fall: not hacking (maybe a collapse)
    ((0.0, 0.0), (1.0, 1.0), (2.0, 0.95)),  # the judge lost 5 % of its gain: a plateau
    ((0.0, 0.0), (1.0, 1.0), (2.0, 1.5)),  # both rise
])
def test_reward_hacking_stays_silent_otherwise(sides):
    assert reward_hacking(hacking_trace(checks(*sides)), RewardHacking()) is None


def test_reward_hacking_needs_a_judge_and_a_new_check():
    cs = checks((0.0, 0.0), (1.0, 1.0), (2.0, 0.5))
    blind = [CheckRecord(c.iteration, c.proxy, None, c.kl, c.length) for c in cs]
    assert reward_hacking(hacking_trace(blind), RewardHacking()) is None
    later = History([5, 10, 11], {}, cs)  # the last check was not made at the last iteration
    assert reward_hacking(later, RewardHacking()) is None


# -- the table and the monitor ----------------------------------------------------------------
def test_every_detector_has_settings_an_action_and_advice_in_the_config():
    health = PPOConfig().health
    for d in DETECTORS:
        assert getattr(health, d.name) == d.settings() and d.advice and d.signals
        assert d.settings().action in ("warn", "stop")
    assert {d.name for d in DETECTORS} == {"reward_hacking", "off_distribution", "length_shift",
                                           "kl_spike",
                                           "entropy_collapse", "critic_divergence",
                                           "flat_reward", "slow_rollout"}


def _feed(monitor: HealthMonitor, kl: list[float], start: int = 1) -> list:
    found = []
    for i, value in enumerate(kl, start):
        found += monitor.observe(i, {"objective/kl": value})
    return found


def test_the_monitor_reports_a_detector_once_and_resumes_from_its_state():
    kl = [1.0] * 6 + [9.0, 9.5, 30.0, 60.0]
    whole = HealthMonitor(PPOConfig().health)
    assert [f.detector for f in _feed(whole, kl)] == ["kl_spike"]
    first = HealthMonitor(PPOConfig().health)
    _feed(first, kl[:4])
    resumed = HealthMonitor(PPOConfig().health)
    resumed.load_state_dict(first.state_dict())
    assert _feed(resumed, kl[4:], start=5) == whole.findings


def test_off_detectors_are_not_watched_and_the_gold_judge_is_never_seen():
    health = PPOConfig().health
    off = health.model_copy(update={"kl_spike": health.kl_spike.model_copy(
        update={"action": "off"})})
    spike = [1.0] * 6 + [14.0, 14.5]
    assert _feed(HealthMonitor(off), spike) == [] and _feed(HealthMonitor(health), spike)
    monitor = HealthMonitor(health)
    answers = CheckAnswers(0, ["a"], [1.0], [2.0], [3.0], [4], [True], [0.5], 0.1)
    monitor.observe(0, {}, answers)
    assert monitor.history.checks == [CheckRecord(0, [1.0], [2.0], 0.5, 4.0, None, [4.0])]


def test_a_reward_hacking_finding_stands_at_the_end_only_while_the_judge_stays_down():
    fell = hacking_trace(checks((0.0, 0.0), (1.0, 1.0), (2.0, 0.5)))
    found = reward_hacking(fell, RewardHacking())
    why = reward_hacking_stands(fell, RewardHacking(), found)
    assert why is not None and "still -0.500" in why and "(iteration 5)" in why
    # the judge comes back by the last check: the dip says nothing of the final policy
    back = hacking_trace(checks((0.0, 0.0), (1.0, 1.0), (2.0, 0.5), (2.5, 1.05)))
    assert reward_hacking_stands(back, RewardHacking(), found) is None


def test_the_monitor_says_which_findings_still_stand_at_the_end():
    """A reward-hacking fall the judge never made up stands; a KL spike never does alone (the
    benchmark's fast start keeps 14 nats after its spike and is the best run of all)."""
    health = PPOConfig().health
    monitor = HealthMonitor(health)
    fell = checks((0.0, 0.0), (1.0, 1.0), (2.0, 0.5))
    for c in fell:
        monitor.observe(c.iteration, {"objective/kl": 0.1 * c.iteration,
                                      "response/length_mean": 10.0},
                        CheckAnswers(c.iteration, [""] * 40, c.proxy, c.judge, None,
                                     [10] * 40, [True] * 40, [c.kl] * 40, 0.0))
    assert [f.detector for f in monitor.findings] == ["reward_hacking"]
    assert "still -0.500" in monitor.standing()["reward_hacking"]
    spiked = HealthMonitor(health)
    for i, value in enumerate([0.0, 23.4, 10.9, 38.2, 13.4, 14.2, 13.2], 1):
        spiked.observe(i, {"objective/kl": value, "response/length_mean": 8.0})
    assert [f.detector for f in spiked.findings] == ["kl_spike"]
    assert spiked.standing() == {}



def test_reward_hacking_by_the_judge_reward_model_needs_the_drift_to_agree():
    """With the judge reward model the default needs off_distribution's drift too (the
    judge's falls alone were false alarms on healthy demo runs); a registered scorer's
    finding stands alone."""
    from rlhf_core.health.detectors import for_scorer

    health = PPOConfig().health
    judged, registered = for_scorer(health, False), for_scorer(health, True)
    assert judged.reward_hacking.min_drift == health.off_distribution.max_drift == 1.6
    assert registered.reward_hacking.min_drift == 0.0
    fall = ((0.0, 0.0), (1.0, 1.0), (2.0, 0.5))
    near = hacking_trace(checks(*fall, drift=1.2))
    assert reward_hacking(near, judged.reward_hacking) is None
    assert reward_hacking(near, registered.reward_hacking) is not None
    far = hacking_trace(checks(*fall, drift=1.7))
    assert reward_hacking(far, judged.reward_hacking) is not None


# -- answers the reward model has not seen ----------------------------------------------------
def drift_trace(drifts: list[float | None]) -> History:
    cs = [CheckRecord(6 * k, [0.1 * k] * 4, None, 2.0 * k, 10.0 + k, d)
          for k, d in enumerate(drifts)]
    return History([c.iteration for c in cs[1:]], {}, cs)


def test_off_distribution_fires_when_the_answers_leave_the_start_cloud_and_says_since_when():
    """The benchmark's shapes (median drift at each check, the 2-core machine): the kl_coef=0
    run 1.48 at 30 and 1.71 at 36; the best healthy seed, which over-optimises a little by
    the gold judge late, 1.53 at the end; the fast start 1.44."""
    s = OffDistribution()
    hacked = [1.0, 1.21, 1.23, 1.45, 1.48, 1.48, 1.71]
    assert all(off_distribution(drift_trace(hacked[:i]), s) is None for i in range(1, 7))
    found = off_distribution(drift_trace(hacked), s)
    assert found is not None and found.iteration == 36 and found.onset == 30
    assert found.evidence["drift"] == 1.71 and "1.71x as far" in found.message
    healthy = [1.0, 1.12, 1.08, 1.14, 1.2, 1.34, 1.39, 1.41, 1.46, 1.51, 1.53]
    fast = [1.0, 1.35, 1.38, 1.28, 1.42, 1.44, 1.42, 1.42, 1.42, 1.4, 1.4]
    for trace_ in (healthy, fast):
        assert all(off_distribution(drift_trace(trace_[:i]), s) is None
                   for i in range(1, len(trace_) + 1))
    assert off_distribution(drift_trace([1.0, None]), s) is None  # no features: no reading


def test_an_off_distribution_finding_stands_only_while_the_answers_stay_out():
    s = OffDistribution()
    spike = [1.0, 2.21, 1.12, 1.08, 1.12]  # out at 6, back from 12 on
    found = off_distribution(drift_trace(spike[:2]), s)
    assert found is not None and off_distribution_stands(drift_trace(spike), s, found) is None
    stays = [1.0, 1.62, 1.7, 1.72]  # seed 7's last checks
    found = off_distribution(drift_trace(stays[:2]), s)
    why = off_distribution_stands(drift_trace(stays), s, found)
    assert why is not None and "(iteration 18)" in why and "1.72x" in why


# -- the answers' length ----------------------------------------------------------------------
def length_trace(lengths: list[float], proxy_gain: float = 0.1) -> History:
    """Checks every 6 iterations with these mean lengths; the proxy rises ``proxy_gain`` a
    check, around a fixed zig-zag (40 prompts)."""
    wiggle = [0.05 * ((i % 5) - 2) for i in range(40)]
    cs = [CheckRecord(6 * k, [proxy_gain * k + w for w in wiggle], None, 1.0 * k, n)
          for k, n in enumerate(lengths)]
    return History([c.iteration for c in cs[1:]], {}, cs)


def test_length_shift_fires_when_the_answers_collapse_while_the_proxy_rises():
    collapse = [12.5, 6.8, 3.1]  # full fine-tuning of SmolLM2 on plain text
    s = LengthShift()
    assert length_shift(length_trace(collapse[:2]), s) is None  # 0.54x: not yet
    found = length_shift(length_trace(collapse), s)
    assert found is not None and found.iteration == 12 and found.onset == 6
    assert found.evidence["length_ratio"] == pytest.approx(3.1 / 12.5)
    assert "4.0x shorter" in found.message
    padded = [9.8, 14.0, 21.0]  # twice as long: the other way
    found = length_shift(length_trace(padded), s)
    assert found is not None and "2.1x longer" in found.message


def test_length_shift_finds_the_recorded_collapse_at_its_first_check():
    """SmolLM2 fully fine-tuned on plain text, as recorded (check/length_mean 12.5, 4.95,
    3.13; the proxy 1.09, 1.64, 1.83): found at iteration 6, where the run found it."""
    run = length_trace([12.5, 4.95, 3.13], 0.37)
    found = length_shift(History(run.iterations[:1], {}, run.checks[:2]), LengthShift())
    assert found is not None and found.iteration == 6 and "shorter" in found.message


@pytest.mark.parametrize("lengths, gain", [
    ([9.8, 11.5, 11.0, 10.8, 10.7, 10.6, 10.7, 10.8, 10.6, 10.6, 10.4], 0.1),  # demo seed 0
    ([12.5, 6.8, 3.1], 0.0),  # shorter, but the reward model does not pay for it
    ([10.05, 11.42, 11.55], 0.12),  # SmolLM2 with LoRA, the example (seed 0, win 0.770)
    ([2.0, 1.0, 1.0], 0.1),  # halved, by one token: noise on one-token answers
])
def test_length_shift_stays_silent_otherwise(lengths, gain):
    h = length_trace(lengths, gain)
    assert all(length_shift(History(h.iterations[:i], {}, h.checks[:i + 1]), LengthShift())
               is None for i in range(len(h.iterations) + 1))


def scored_by_length(correlations: list[float]) -> History:
    """Checks every 6 iterations of 40 answers, 8 to 14 tokens long (a mean of 11 each), whose
    proxy score is the check's gain plus ``c`` times the answer's standardised length plus an
    independent part: their correlation with the length is ``c`` exactly."""
    lengths = [8.0 + (i % 7) for i in range(40)]
    mu = statistics.fmean(lengths)
    z = [(n - mu) / statistics.pstdev(lengths) for n in lengths]
    rest = [math.sin(1.7 * i + 0.3) for i in range(40)]  # made orthogonal to z below
    dot = sum(a * b for a, b in zip(rest, z)) / sum(b * b for b in z)
    rest = [a - dot * b for a, b in zip(rest, z)]
    rest = [a / statistics.pstdev(rest) for a in rest]
    cs = [CheckRecord(6 * k, [0.2 * k + c * a + math.sqrt(1 - c * c) * b
                              for a, b in zip(z, rest)], None, 1.0 * k, mu, None, lengths)
          for k, c in enumerate(correlations)]
    return History([c.iteration for c in cs[1:]], {}, cs)


def test_length_shift_fires_when_the_proxy_keeps_scoring_longer_answers_higher():
    """The benchmark's seed 8 (win 0.674 against SFT by the gold judge, its reward-model
    features never far out): the proxy's correlation with the answers' length at its checks
    -0.02, 0.17, 0.04, 0.21, 0.14, 0.25, 0.31, 0.50, 0.64, 0.67, 0.69. The healthy runs' highest:
    0.37 (the adaptive KL controller, at its last check)."""
    s = LengthShift()
    seed8 = [-0.02, 0.17, 0.04, 0.21, 0.14, 0.25, 0.31, 0.49, 0.64, 0.67, 0.69]
    h = scored_by_length(seed8)
    assert length_correlation(h.checks[8]) == pytest.approx(0.64)
    first = next(i for i in range(1, len(seed8))
                 if length_shift(History(h.iterations[:i], {}, h.checks[:i + 1]), s))
    found = length_shift(History(h.iterations[:first], {}, h.checks[:first + 1]), s)
    assert first == 9 and found.iteration == 54 and found.onset == 42
    assert found.evidence["length_correlation"] == pytest.approx(0.67)
    assert "longer answers higher" in found.message and "+0.67" in found.message
    assert length_shift_stands(h, s, found) is not None
    healthy = [0.15, -0.05, 0.02, 0.02, -0.57, -0.68, -0.10, 0.14, 0.35, 0.26, 0.37]
    for trace_ in (healthy, [0.1, 0.6, 0.2, 0.6]):  # never two checks in a row
        h = scored_by_length(trace_)
        assert all(length_shift(History(h.iterations[:i], {}, h.checks[:i + 1]), s) is None
                   for i in range(len(trace_)))
    assert math.isnan(length_correlation(CheckRecord(0, [1.0, 2.0, 3.0], None, 0.0, 5.0)))
    flat = CheckRecord(0, [1.0, 2.0, 3.0], None, 0.0, 5.0, None, [5.0, 5.0, 5.0])
    assert math.isnan(length_correlation(flat))  # every answer as long: no reading


def test_a_length_shift_stands_only_while_the_answers_stay_that_long():
    s = LengthShift()
    found = length_shift(length_trace([12.5, 3.1]), s)
    assert found is not None
    assert length_shift_stands(length_trace([12.5, 3.1, 9.0]), s, found) is None
    why = length_shift_stands(length_trace([12.5, 3.1, 3.4]), s, found)
    assert why is not None and "3.4 tokens" in why and "12.5" in why


def test_a_critic_climbing_from_a_poor_warm_start_is_not_diverging():
    """SmolLM2 with LoRA (PPO lr 2e-4): the critic, warm-started from a reward model that never
    scored partial answers, explains -14x at first and climbs to about -0.9 in 12 iterations;
    at lr 5e-5 it stays between -18 and -4 (not climbing: with a loss that does not shrink, a
    warning)."""
    def fired(ev):
        return next((i for i in range(1, len(ev) + 1) if critic_divergence(
            trace(**{"loss/value_avg": [1.0] * i, "val/explained_variance": ev[:i]}),
            CriticDivergence()) is not None), None)

    climbing = [-14.16, -5.91, -5.81, -6.41, -2.92, -1.76, -3.93, -1.11, -2.44, -0.69, -0.97,
                -0.88]
    stuck = [-14.16, -10.31, -14.34, -18.38, -17.22, -4.57, -8.2, -16.57, -7.23, -7.27, -13.31,
             -3.83]
    assert fired(climbing) is None
    assert fired(stuck) == 5


def test_a_never_fitted_critic_whose_error_keeps_shrinking_is_fitting():
    """SmolLM2 (LoRA, seed 1): the explained variance falls from -1.7 to -12.6 and climbs back
    to -0.9 while the value loss falls 100x (the returns' variance falls faster as the rewards
    settle): fitting. So is the benchmark's critic shocked by rewards x100 (its loss 1604 ->
    8 by iteration 5, explained variance 0.6 at 14). A critic whose loss does not shrink is
    found at 5."""
    def fired(ev, loss):
        return next((i for i in range(1, len(ev) + 1) if critic_divergence(
            trace(**{"loss/value_avg": loss[:i], "val/explained_variance": ev[:i]}),
            CriticDivergence()) is not None), None)

    loss = [5.911, 3.272, 1.413, 0.961, 0.701, 0.41, 0.208, 0.12, 0.097, 0.085, 0.148, 0.059]
    ev = [-1.731, -4.478, -3.572, -12.587, -10.667, -5.377, -3.627, -2.616, -2.345, -0.919,
          -0.51, -0.944]
    assert fired(ev, loss) is None
    shocked = [1604.0, 568.8, 246.3, 42.5, 7.95, 3.43, 2.54, 1.93]
    shocked_ev = [-0.003, -0.001, 0.0, -0.128, -0.244, -0.532, 0.096, 0.179]
    assert fired(shocked_ev, shocked) is None
    assert fired(ev, [loss[0] * 0.9] * len(ev)) == 5  # a loss that does not move
    assert fired(ev, [5.911, 3.272, 5.0, 4.0, 3.5, 3.2]) == 5  # halved once, then back up
