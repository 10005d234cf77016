"""The base of every policy model: unknown keys are errors (a typo must not be silently ignored), models are
immutable once loaded, and fields may be given by name or alias. Also the pattern rule and tier names follow."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["NAME_PATTERN", "StrictModel"]

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"  # rule and tier names travel in headers and metric labels


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
