"""The policy's `budgets` section: validation (each error naming its field and line) and calendar periods in UTC."""

from __future__ import annotations

import datetime as dt

import pytest

from tiergate.policies.budgets import OnExceed, OnRedisDown, Period, span
from tiergate.policies.loader import PolicyError, parse_policy

from .conftest import BASE

COSTS = """\
costs:
  currency: EUR
  reference_tier: cloud
  prices:
    cloud: {prompt_per_1k: 0.6, completion_per_1k: 2.4}
"""
DIGEST = "ab" * 32


def _policy(budgets: str, costs: str = COSTS) -> str:
    return BASE.replace("rules:\n", costs + budgets + "rules:\n", 1)


def _errors(text: str) -> dict[str, int | None]:
    with pytest.raises(PolicyError) as err:
        parse_policy(text, "p.yaml")
    return {p.field: p.line for p in err.value.problems}


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_a_budget_section_is_read_with_its_defaults():
    policy = parse_policy(_policy(f"""\
budgets:
  tenants:
    acme:
      period: week
      hard: 100
      soft: 80
      on_exceed: downgrade
      downgrade_to: edge
      keys:
        {DIGEST}: {{hard: 5, period: day}}
"""))
    b = policy.budgets
    assert b is not None and b.on_redis_down is OnRedisDown.REFUSE and b.stream_cost and b.retention_days == 35
    acme = b.tenants["acme"]
    assert (acme.period, acme.hard, acme.soft, acme.on_exceed, acme.downgrade_to) == (
        Period.WEEK, 100, 80, OnExceed.DOWNGRADE, "edge")
    assert acme.keys[DIGEST].period is Period.DAY and acme.keys[DIGEST].soft is None


@pytest.mark.parametrize(("body", "field"), [
    ("    acme: {hard: 10, soft: 20}\n", "budgets.tenants.acme"),
    ("    acme: {hard: -1}\n", "budgets.tenants.acme.hard"),
    ("    acme: {hard: .nan}\n", "budgets.tenants.acme.hard"),
    ("    acme: {period: year, hard: 1}\n", "budgets.tenants.acme.period"),
    ("    acme: {}\n", "budgets.tenants.acme"),
    ("    acme: {hard: 1, on_exceed: downgrade}\n", "budgets.tenants.acme"),
    ("    acme: {hard: 1, keys: {not-a-digest: {hard: 1}}}\n", "budgets.tenants.acme"),
    ("    acme: {hard: 1, on_exceed: downgrade, downgrade_to: nowhere}\n", "budgets.tenants.acme.downgrade_to"),
    ("    acme: {hard: 1, spend: 3}\n", "budgets.tenants.acme.spend"),
])
def test_a_bad_budget_is_an_error_naming_its_field_and_line(body, field):
    text = _policy("budgets:\n  tenants:\n" + body)
    errors = _errors(text)
    assert field in errors, errors
    assert errors[field] == _line_of(text, "    acme:")


def test_budgets_without_costs_are_an_error():
    text = _policy("budgets:\n  tenants:\n    acme: {hard: 1}\n", costs="")
    assert "budgets" in _errors(text)


def test_on_redis_down_takes_only_refuse_or_allow():
    assert parse_policy(_policy("budgets: {on_redis_down: allow}\n")).budgets.on_redis_down is OnRedisDown.ALLOW
    assert "budgets.on_redis_down" in _errors(_policy("budgets: {on_redis_down: maybe}\n"))


@pytest.mark.parametrize(("period", "now", "pid", "start", "end"), [
    (Period.DAY, "2026-11-27T23:59:59+00:00", "2026-11-27", "2026-11-27", "2026-11-28"),
    (Period.DAY, "2026-11-28T00:30:00+02:00", "2026-11-27", "2026-11-27", "2026-11-28"),  # taken in UTC
    (Period.WEEK, "2026-11-27T12:00:00+00:00", "2026-W48", "2026-11-23", "2026-11-30"),  # ISO weeks from Monday
    (Period.WEEK, "2027-01-01T00:00:00+00:00", "2026-W53", "2026-12-28", "2027-01-04"),
    (Period.MONTH, "2028-02-29T08:00:00+00:00", "2028-02", "2028-02-01", "2028-03-01"),
    (Period.MONTH, "2026-12-31T23:00:00+00:00", "2026-12", "2026-12-01", "2027-01-01"),
])
def test_periods_are_calendar_periods_in_utc(period, now, pid, start, end):
    s = span(period, dt.datetime.fromisoformat(now))
    assert (s.id, s.start.date().isoformat(), s.end.date().isoformat()) == (pid, start, end)
    assert s.start.tzinfo == dt.UTC
    assert len(s.days()) == (s.end - s.start).days and s.days()[0] == start
    t = dt.datetime.fromisoformat(now)
    assert s.left_s(t) == (s.end - t).total_seconds()
