"""The health rules that read the held-out checks (reward hacking, answers off the start's
distribution, a length shift) on hand-made traces, fires on the failure's signature and silent
on the healthy shape next to it; the monitor reports a detector once and resumes from its state
as if never stopped."""

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
from rlhf_core.health.records import CheckRecord, History
from rlhf_core.health.watch import CheckAnswers, HealthMonitor


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
