"""The base of every config section: frozen, strict (an unknown key is an error), no NaN or
infinity. How a form draws a section and reads it back is the pipeline config's business
(tasks/config/form.py), not the sections'."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A frozen, strict config section."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
