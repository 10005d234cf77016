"""The policy's `budgets` section: what a tenant (and one of its keys) may spend in a period, in the `costs`
currency, and what happens at the limits.

A budget's `hard` limit refuses (or, with `on_exceed: downgrade`, sends the request to the cheaper
`downgrade_to` tier) once the request's worst-case cost no longer fits; its `soft` limit only alerts. Periods
are calendar periods in UTC (a day, an ISO week from Monday, a month), so every replica agrees where one ends.
Budgets are in money, so they need the policy's `costs`. `on_redis_down` says what a hard budget does while
the shared ledger cannot be read: refuse (the budget holds) or allow (the API stays up; alerted). See
docs/policy.md, "Budgets".

Tested in `tests/policies/test_budgets.py`.
"""

from __future__ import annotations

import calendar
import datetime as dt
import enum
import re

from pydantic import Field, model_validator

from tiergate.policies.base import NAME_PATTERN, StrictModel

__all__ = ["Budget", "BudgetsConfig", "OnExceed", "OnRedisDown", "Period", "PeriodSpan", "TenantBudget", "span"]


class Period(enum.StrEnum):
    DAY = "day"
    WEEK = "week"
    MONTH = "month"


class OnExceed(enum.StrEnum):
    REFUSE = "refuse"  # a 429 `budget_exceeded`, Retry-After at the period's end
    DOWNGRADE = "downgrade"  # answered by `downgrade_to` instead, while its worst case still fits


class OnRedisDown(enum.StrEnum):
    REFUSE = "refuse"  # a 503 `budget_unavailable`: no spend that cannot be counted
    ALLOW = "allow"  # admitted unchecked, counted in tiergate_budget_unchecked_total and logged


class Budget(StrictModel):
    """A limit in money over a period; `hard` and `soft` may each be left out (a soft-only budget only alerts)."""

    period: Period = Field(Period.MONTH, description="a calendar day, ISO week or month, in UTC")
    hard: float | None = Field(None, gt=0, allow_inf_nan=False, description="refuse beyond this spend")
    soft: float | None = Field(None, gt=0, allow_inf_nan=False, description="alert (log + metric) beyond this")

    @model_validator(mode="after")
    def _soft_below_hard(self) -> Budget:
        if self.hard is None and self.soft is None:
            raise ValueError("give `hard`, `soft` or both")
        if self.hard is not None and self.soft is not None and self.soft > self.hard:
            raise ValueError(f"soft ({self.soft}) is above hard ({self.hard}): it would never alert first")
        return self


class TenantBudget(Budget):
    """A tenant's budget, what it does at the hard limit, and its keys' own budgets (by the key's SHA-256)."""

    on_exceed: OnExceed = OnExceed.REFUSE
    downgrade_to: str | None = Field(None, description="the cheaper tier for `on_exceed: downgrade`")
    keys: dict[str, Budget] = Field(default_factory=dict, description="per key, by its SHA-256 (hex), as in the "
                                                                       "key file")

    @model_validator(mode="after")
    def _downgrade_named(self) -> TenantBudget:
        if (self.on_exceed is OnExceed.DOWNGRADE) != (self.downgrade_to is not None):
            raise ValueError("`on_exceed: downgrade` and `downgrade_to` go together")
        for digest in self.keys:
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ValueError(f"keys: {digest[:16]!r}… is not a lowercase hex SHA-256 of a key")
        return self


class BudgetsConfig(StrictModel):
    """Budgets per tenant, what a hard budget does while Redis is down, and whether streams carry their cost."""

    on_redis_down: OnRedisDown = Field(OnRedisDown.REFUSE, description="what a hard budget does while the "
                                                                       "shared ledger is unreachable")
    stream_cost: bool = Field(True, description="put `cost` in a stream's final usage chunk when the client "
                                                "asked for usage (a request opts out with `x-tiergate-cost: off`)")
    retention_days: int = Field(35, ge=31, le=800, description="how long daily spend records are kept")
    tenants: dict[str, TenantBudget] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _tenant_names(self) -> BudgetsConfig:
        for name in self.tenants:
            if not re.match(NAME_PATTERN, name):
                raise ValueError(f"tenant name {name!r} must be letters, digits, '_', '.', '-' (max 63)")
        return self


class PeriodSpan(StrictModel):
    """One period: its id (part of a ledger key), its start and its end (exclusive), in UTC."""

    id: str
    start: dt.datetime
    end: dt.datetime

    def left_s(self, now: dt.datetime) -> float:
        return max(0.0, (self.end - now).total_seconds())

    def days(self) -> list[str]:
        """Every day of the period, as the ledger names them (ISO dates)."""
        n = (self.end - self.start).days
        return [(self.start + dt.timedelta(days=i)).date().isoformat() for i in range(n)]


def span(period: Period, now: dt.datetime) -> PeriodSpan:
    """The period of kind `period` that contains `now` (an aware datetime; taken in UTC)."""
    now = now.astimezone(dt.UTC)
    day = dt.datetime(now.year, now.month, now.day, tzinfo=dt.UTC)
    if period is Period.DAY:
        return PeriodSpan(id=day.date().isoformat(), start=day, end=day + dt.timedelta(days=1))
    if period is Period.WEEK:
        start = day - dt.timedelta(days=day.weekday())
        year, week, _ = start.isocalendar()
        return PeriodSpan(id=f"{year}-W{week:02d}", start=start, end=start + dt.timedelta(days=7))
    start = day.replace(day=1)
    length = calendar.monthrange(now.year, now.month)[1]
    return PeriodSpan(id=f"{now.year}-{now.month:02d}", start=start, end=start + dt.timedelta(days=length))
