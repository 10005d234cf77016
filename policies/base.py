"""The base of every policy model: unknown keys are errors (a typo must not be silently ignored), models are
immutable once loaded, and fields may be given by name or alias."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["StrictModel"]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
