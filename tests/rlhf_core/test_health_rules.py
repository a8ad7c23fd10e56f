"""The health rules on a run's own dynamics (KL, entropy, the critic, the reward's clip, the
rollout's share of time) on hand-made traces, each against what a person reading the numbers
would say: fires on the failure's signature, silent on the healthy shape next to it."""

from __future__ import annotations

import math

import pytest

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
from rlhf_core.health.records import History


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
