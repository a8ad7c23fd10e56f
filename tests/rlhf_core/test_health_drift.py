"""The drift of answers in the reward model's feature space against a naive reference: the
start cloud's principal directions from the eigenvectors of its covariance, each coordinate
divided by its standard deviation, the distance over the start answers' median."""

from __future__ import annotations

import json

import pytest
import torch

from rlhf_core.health.watch import FeatureBasis


def cloud(n: int, h: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(h, h, generator=g, dtype=torch.float64)
    return torch.randn(n, h, generator=g, dtype=torch.float64) @ mix + 3.0


def naive_distance(start: torch.Tensor, x: torch.Tensor, k: int) -> torch.Tensor:
    mean = start.mean(0)
    values, vectors = torch.linalg.eigh(torch.cov(start.T))  # ascending
    top = vectors[:, -k:]
    z = (x - mean) @ top / values[-k:].sqrt()
    return z.norm(dim=1)


@pytest.mark.parametrize("n, h", [(128, 16), (64, 576), (40, 40)])
def test_the_distance_is_the_naive_whitened_distance_in_the_top_quarter(n, h):
    start, later = cloud(n, h), cloud(n, h, seed=1)
    basis = FeatureBasis.fit(start)
    k = min(n // 4, h)
    assert basis.directions.shape == (k, h)
    assert torch.allclose(basis.distance(later), naive_distance(start, later, k), rtol=1e-6)
    assert float(basis.drift(start).median()) == pytest.approx(1.0)


def test_drift_is_scale_and_shift_free_and_grows_as_answers_leave():
    start, later = cloud(128, 32), cloud(128, 32, seed=1)
    basis = FeatureBasis.fit(start)
    moved = FeatureBasis.fit(start * 7.0 - 2.0)
    assert torch.allclose(basis.drift(later), moved.drift(later * 7.0 - 2.0), rtol=1e-6)
    shifted = start + 3.0 * start.std(0)  # the same answers, moved away
    assert float(basis.drift(shifted).median()) > 2.0


def test_a_basis_round_trips_through_json_and_refuses_what_it_cannot_fit():
    basis = FeatureBasis.fit(cloud(64, 24))
    back = FeatureBasis.from_state(json.loads(json.dumps(basis.state_dict())))
    x = cloud(16, 24, seed=3)
    assert torch.equal(basis.drift(x), back.drift(x))
    with pytest.raises(ValueError, match="N >= 2"):
        FeatureBasis.fit(torch.zeros(1, 8))
    with pytest.raises(ValueError, match="all the same"):
        FeatureBasis.fit(torch.ones(10, 8))
    rank_two = cloud(50, 2) @ torch.randn(2, 30, dtype=torch.float64)  # 30 dims, rank 2
    assert FeatureBasis.fit(rank_two).directions.shape[0] == 2
