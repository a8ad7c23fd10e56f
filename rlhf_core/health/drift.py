"""How far the policy's answers lie from its start policy's in the reward model's feature space
(the whitened last hidden state its head reads), where hacked answers tend to be outliers
(README § Sources [InfoRM]); in units of the start answers' median, so about 1 at the start.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

COMPONENTS_SHARE = 0.25  # principal directions per answer of the first check


@dataclass(frozen=True)
class FeatureBasis:
    """The start answers' features: mean [H], principal directions [k, H], std along each [k]
    and their own median whitened distance (the unit of :meth:`drift`)."""

    mean: torch.Tensor
    directions: torch.Tensor
    scale: torch.Tensor
    typical: float

    @classmethod
    def fit(cls, features: torch.Tensor, share: float = COMPONENTS_SHARE) -> FeatureBasis:
        """features [N, H] (N >= 2) of the start policy's answers -> their basis."""
        if features.ndim != 2 or features.shape[0] < 2:
            raise ValueError(f"feature basis: need [N >= 2, H] features, got "
                             f"{tuple(features.shape)}")
        x = features.double()
        mean = x.mean(0)
        _, s, vh = torch.linalg.svd(x - mean, full_matrices=False)  # s [min(N, H)]
        scale = s / (x.shape[0] - 1) ** 0.5
        k = max(1, min(int(x.shape[0] * share), int((scale > 1e-8 * scale[0]).sum())))
        if scale[0] <= 0:
            raise ValueError("feature basis: the start answers' features are all the same")
        # contiguous copies: a resumed run's basis (read back from JSON) computes alike
        directions, scale = vh[:k].contiguous(), scale[:k].contiguous()
        basis = cls(mean, directions, scale, 1.0)
        return cls(mean, directions, scale, float(basis.distance(features).median()))

    def distance(self, features: torch.Tensor) -> torch.Tensor:
        """features [N, H] -> whitened distance from the start answers' mean [N]."""
        z = ((features.double() - self.mean) @ self.directions.T) / self.scale  # [N, k]
        return z.norm(dim=1)

    def drift(self, features: torch.Tensor) -> torch.Tensor:
        """features [N, H] -> each answer's distance over the start answers' median [N]."""
        return self.distance(features) / max(self.typical, 1e-12)

    # -- checkpoints: plain lists (JSON) ---------------------------------------------------------
    def state_dict(self) -> dict:
        return {"mean": self.mean.tolist(), "directions": self.directions.tolist(),
                "scale": self.scale.tolist(), "typical": self.typical}

    @classmethod
    def from_state(cls, state: dict) -> FeatureBasis:
        as_tensor = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
        return cls(as_tensor(state["mean"]), as_tensor(state["directions"]),
                   as_tensor(state["scale"]), float(state["typical"]))
