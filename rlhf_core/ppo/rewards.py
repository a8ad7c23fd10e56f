"""The reward PPO optimises: the run's reward model and text scorers (built by
tasks/pipeline/rewards.py), weighted and combined as TRL's ``reward_weights``; a source may
abstain on a row (None), and a row no source scored takes no part in the update.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

# (responses' text, the prompt data's row of each) -> a score or None (abstain) per row
TextScore = Callable[[list[str], list[int]], Sequence[float | None]]


@dataclass(frozen=True)
class TextScorer:
    """A source that reads the answers' text."""

    name: str
    weight: float
    score: TextScore


@dataclass(frozen=True)
class RewardMix:
    """The reward's sources: the reward model as ``model_name`` (None: not a source) and the
    text ``scorers``, at least one of them (ppo.reward_sources); by default the reward model
    alone."""

    model_name: str | None = "rm"
    model_weight: float = 1.0
    scorers: tuple[TextScorer, ...] = field(default_factory=tuple)
    aggregation: str = "sum"  # ppo.reward_aggregation

    @property
    def alone(self) -> bool:
        """The reward model alone at weight 1 (the reward is its normalised score)."""
        return not self.scorers and self.model_name is not None and self.model_weight == 1.0

    @property
    def weights(self) -> dict[str, float]:
        head = {self.model_name: self.model_weight} if self.model_name is not None else {}
        return {**head, **{s.name: s.weight for s in self.scorers}}


def call_scorer(scorer: TextScorer, texts: list[str], rows: list[int],
                iteration: int | None = None):
    """``scorer``'s answer for the batch; its errors fail the iteration naming the source,
    except a ``stops_run`` one, which passes as it is."""
    try:
        return scorer.score(texts, rows)
    except Exception as err:
        if getattr(err, "stops_run", False):
            raise
        where = f" (PPO iteration {iteration})" if iteration else ""
        raise ValueError(f"reward source {scorer.name!r}{where} failed: "
                         f"{type(err).__name__}: {err}") from err


def checked_scores(name: str, values: Sequence[float | None] | object, n: int,
                   iteration: int | None = None) -> torch.Tensor:
    """A source's answer as a float tensor [n], NaN where it abstained; a bad length or value
    fails, naming the source and row."""
    where = f"reward source {name!r}" + (f" (PPO iteration {iteration})" if iteration else "")
    try:
        values = list(values)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"{where}: returned {type(values).__name__}, not one score per "
                         "row") from None
    if len(values) != n:
        raise ValueError(f"{where}: {len(values)} scores for {n} rows")
    out = []
    for row, v in enumerate(values):
        if v is None:
            out.append(math.nan)
            continue
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: row {row} is {v!r}, not a number or None") from None
        if not math.isfinite(f):
            raise ValueError(f"{where}: row {row} is {f}, not a finite score")
        out.append(f)
    return torch.tensor(out, dtype=torch.float32)


def whiten(x: torch.Tensor) -> torch.Tensor:
    """(x - mean) / std over the rows that are not NaN (NaN stays NaN; one row: 0)."""
    seen = ~torch.isnan(x)
    if not seen.any():
        return x
    v = x[seen]
    std = v.std(unbiased=False) if v.numel() > 1 else v.new_tensor(0.0)
    return (x - v.mean()) / (std + 1e-8)


def combine(parts: dict[str, torch.Tensor], weights: dict[str, float],
            aggregation: str) -> torch.Tensor:
    """The weighted sum over the sources that scored each row (NaN: none did) -> [B];
    ``normalize_then_sum`` whitens each source over the batch first."""
    total, seen = None, None
    for name, x in parts.items():
        if aggregation == "normalize_then_sum":
            x = whiten(x)
        w = weights[name]
        term = torch.nan_to_num(x if w == 1.0 else w * x, nan=0.0)
        scored = ~torch.isnan(x)
        total = term if total is None else total + term
        seen = scored if seen is None else seen | scored
    return torch.where(seen, total, torch.full_like(total, math.nan))


def scored_rows(combined: torch.Tensor, group: int = 1) -> torch.Tensor:
    """Indices of the rows that take part: scored, in a ``group`` whose every row was scored."""
    ok = ~torch.isnan(combined)
    if group > 1:
        ok = ok.view(-1, group).all(dim=1, keepdim=True).expand(-1, group).reshape(-1)
    return ok.nonzero().squeeze(1)


def source_metrics(raw: dict[str, torch.Tensor], parts: dict[str, torch.Tensor],
                   aggregation: str, unscored: float) -> dict[str, float]:
    """Per source ``reward/<name>/raw_mean|raw_std|mean|std|abstain_rate`` (mean/std as they
    enter the sum), and ``reward/unscored_rate``."""
    out = {"reward/unscored_rate": unscored}
    for name, x in raw.items():
        seen = ~torch.isnan(x)
        part = parts[name] if aggregation == "sum" else whiten(parts[name])
        for key, t in (("raw", x), ("", part)):
            v = t[seen].float()
            prefix = f"reward/{name}/{key + '_' if key else ''}"
            out[prefix + "mean"] = float(v.mean()) if v.numel() else math.nan
            out[prefix + "std"] = float(v.std(unbiased=False)) if v.numel() else math.nan
        out[f"reward/{name}/abstain_rate"] = float((~seen).float().mean())
    return out
