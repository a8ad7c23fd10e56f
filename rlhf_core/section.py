"""The base of every config section: frozen, strict (an unknown key is an error), no NaN or
infinity."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A frozen, strict config section."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
