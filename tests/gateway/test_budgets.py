"""Budgets at admission, on the in-process ledger: the worst case a request reserves, the 429 past a hard limit (or
the downgrade), alerts, settling, and what a hard budget does while the ledger is unreachable."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Mapping, Sequence

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from tiergate.core.errors import OpenAIError
from tiergate.core.types import Cascade, Decision
from tiergate.gateway.auth import hash_key
from tiergate.gateway.budgets import Budgets, key_id, worst_case
from tiergate.gateway.ledger import NANO, Counter, LocalLedger
from tiergate.gateway.metrics import GatewayMetrics
from tiergate.policies.loader import parse_policy
from tiergate.policies.model import Policy

KEY = hash_key("key-alpha-1")
OTHER = hash_key("key-alpha-2")
NOW = dt.datetime(2026, 11, 27, 18, 0, tzinfo=dt.UTC).timestamp()  # a Friday: 6 h left of the day


def _policy(budgets: str) -> Policy:
    return parse_policy(f"""\
version: 1
tiers:
  edge: {{kind: edge, model: tiergate-edge, max_context: 100}}
  cloud: {{kind: cloud, model: tiergate-cloud, endpoints: ["http://127.0.0.1:1"], max_context: 1000}}
costs:
  currency: USD
  reference_tier: cloud
  prices:
    edge: {{prompt_per_1k: 1000, completion_per_1k: 1000}}
    cloud: {{prompt_per_1k: 2000, completion_per_1k: 4000}}
budgets:
{budgets}
rules:
  - name: default
    tier: edge
""")


PLAIN = _policy(f"""\
  tenants:
    alpha:
      period: day
      hard: 100
      soft: 50
      keys:
        {KEY}: {{hard: 30, period: week}}
""")


def _budgets(clock: float = NOW) -> tuple[Budgets, GatewayMetrics]:
    metrics = GatewayMetrics(CollectorRegistry())
    return Budgets(metrics, LocalLedger(lambda: clock), clock=lambda: clock), metrics


def _value(metrics: GatewayMetrics, name: str, **labels: str) -> float:
    """A sample of one of the budget series (each metric's samples, searched by name and labels)."""
    for metric in (metrics.budget_refused, metrics.budget_alerts, metrics.budget_unchecked, metrics.ledger_errors):
        for family in metric.collect():
            for sample in family.samples:
                if sample.name == name and sample.labels == labels:
                    return sample.value
    return 0.0


def test_the_worst_case_is_the_costliest_tier_a_request_may_reach():
    p = PLAIN
    assert worst_case(p, Decision("r", "edge"), 10, 5) == 15  # 1 per token on the edge
    assert worst_case(p, Decision("r", "edge", fallbacks=("cloud",)), 10, 5) == 40  # its fallback costs more
    assert worst_case(p, Decision("r", "edge", cascade=Cascade(escalate_to="cloud")), 10, 5) == 15 + 40
    assert worst_case(p, Decision("r", "edge"), 10, None) == 100  # no max_tokens: the rest of the tier's context
    assert worst_case(p, Decision("r", None), 10, 5) == 0


def test_a_hard_limit_refuses_with_an_openai_429_until_the_periods_end():
    budgets, metrics = _budgets()

    async def run() -> OpenAIError:
        for _ in range(3):
            hold, downgraded = await budgets.reserve(PLAIN, "alpha", OTHER, 30.0)
            assert hold is not None and hold.amount == 30 * NANO and not downgraded
        with pytest.raises(OpenAIError) as over:
            await budgets.reserve(PLAIN, "alpha", OTHER, 10.5)  # 90 + 10.5 > 100
        assert (await budgets.reserve(PLAIN, "alpha", OTHER, 10.0))[0] is not None  # exactly at the limit fits
        return over.value

    err = asyncio.run(run())
    assert err.status == 429 and err.type == "insufficient_quota" and err.code == "budget_exceeded"
    assert err.headers["retry-after"] == str(6 * 3600)  # the day ends at midnight UTC
    assert err.headers["x-should-retry"] == "false"
    assert "100.0 USD" in err.message and "2026-11-28T00:00:00+00:00" in err.message
    assert _value(metrics, "tiergate_budget_refused_total", tenant="alpha", scope="tenant", action="refused") == 1


def test_a_keys_budget_holds_for_that_key_alone():
    budgets, metrics = _budgets()

    async def run() -> OpenAIError:
        assert (await budgets.reserve(PLAIN, "alpha", KEY, 30.0))[0] is not None
        with pytest.raises(OpenAIError) as over:
            await budgets.reserve(PLAIN, "alpha", KEY, 1.0)
        assert (await budgets.reserve(PLAIN, "alpha", OTHER, 70.0))[0] is not None  # the tenant's 100 holds both
        with pytest.raises(OpenAIError):
            await budgets.reserve(PLAIN, "alpha", OTHER, 1.0)
        return over.value

    err = asyncio.run(run())
    assert "This API key" in err.message
    assert err.headers["retry-after"] == str(int(dt.datetime(2026, 11, 30, tzinfo=dt.UTC).timestamp() - NOW))
    assert _value(metrics, "tiergate_budget_refused_total", tenant="alpha", scope="key", action="refused") == 1


def test_a_tenant_without_a_budget_reserves_nothing():
    budgets, _ = _budgets()
    assert asyncio.run(budgets.reserve(PLAIN, "beta", KEY, 1e9)) == (None, False)


def test_past_the_hard_limit_a_downgrade_policy_sends_the_request_to_the_cheaper_tier_while_it_fits():
    policy = _policy("  tenants:\n    alpha: {period: day, hard: 100, on_exceed: downgrade, downgrade_to: edge}\n")
    budgets, metrics = _budgets()

    async def run() -> None:
        await budgets.reserve(policy, "alpha", KEY, 90.0)
        hold, downgraded = await budgets.reserve(policy, "alpha", KEY, 40.0, lambda: 8.0)
        assert downgraded and hold is not None and hold.amount == 8 * NANO
        with pytest.raises(OpenAIError) as over:  # 98 reserved: not even the cheaper tier's 8 fits now
            await budgets.reserve(policy, "alpha", KEY, 40.0, lambda: 8.0)
        assert over.value.code == "budget_exceeded"

    asyncio.run(run())
    assert _value(metrics, "tiergate_budget_refused_total", tenant="alpha", scope="tenant", action="downgraded") == 1


def test_settling_corrects_the_reservation_and_alerts_once_at_the_soft_and_hard_limits():
    budgets, metrics = _budgets()

    async def run() -> None:
        hold, _ = await budgets.reserve(PLAIN, "alpha", OTHER, 40.0)
        await budgets.settle(hold, PLAIN, "alpha", OTHER, 10.0, {"cost": 10.0})  # 40 reserved, 10 used
        hold, _ = await budgets.reserve(PLAIN, "alpha", OTHER, 90.0)  # fits only because 30 were given back
        await budgets.settle(hold, PLAIN, "alpha", OTHER, 45.0, {"cost": 45.0})  # 55: past the soft 50
        hold, _ = await budgets.reserve(PLAIN, "alpha", OTHER, 5.0)
        await budgets.settle(hold, PLAIN, "alpha", OTHER, 5.0, {"cost": 5.0})  # still past it: no second alert
        hold, _ = await budgets.reserve(PLAIN, "alpha", OTHER, 40.0)
        await budgets.settle(hold, PLAIN, "alpha", OTHER, 40.0, {"cost": 40.0})  # 100: the hard limit reached

    with capture_logs() as logs:
        asyncio.run(run())
    alerts = [(e["level"], e["spent"]) for e in logs if e["event"] == "budget_alert"]
    assert alerts == [("soft", 55.0), ("hard", 100.0)]
    assert _value(metrics, "tiergate_budget_alerts_total", tenant="alpha", scope="tenant", level="soft") == 1
    assert _value(metrics, "tiergate_budget_alerts_total", tenant="alpha", scope="tenant", level="hard") == 1


class _Down:
    """A ledger whose Redis does not answer."""

    shared = True

    async def reserve(self, counters: Sequence[Counter], amount: int) -> tuple[int, int] | None:
        raise ConnectionError("redis down")

    async def settle(self, counters: Sequence[Counter], delta: int, day: str, fields: Mapping[str, float],
                     ttl_s: int) -> list[int]:
        raise ConnectionError("redis down")

    async def read(self, counters: Sequence[str], days: Sequence[str], fields: Sequence[str]) -> tuple[
            list[int], list[float]]:
        raise ConnectionError("redis down")


def test_with_the_ledger_down_a_hard_budget_refuses_by_default():
    metrics = GatewayMetrics(CollectorRegistry())
    budgets = Budgets(metrics, _Down(), clock=lambda: NOW)
    with capture_logs() as logs, pytest.raises(OpenAIError) as err:
        asyncio.run(budgets.reserve(PLAIN, "alpha", KEY, 1.0))
    assert err.value.status == 503 and err.value.code == "budget_unavailable" and err.value.type == "server_error"
    assert [e["on_redis_down"] for e in logs if e["event"] == "budget_unavailable"] == ["refuse"]
    assert _value(metrics, "tiergate_spend_ledger_errors_total", op="reserve") == 1


def test_with_the_ledger_down_allow_admits_unchecked_and_alerts():
    policy = _policy("  on_redis_down: allow\n  tenants:\n    alpha: {hard: 1}\n")
    metrics = GatewayMetrics(CollectorRegistry())
    budgets = Budgets(metrics, _Down(), clock=lambda: NOW)
    with capture_logs() as logs:
        assert asyncio.run(budgets.reserve(policy, "alpha", KEY, 1e6)) == (None, False)
        asyncio.run(budgets.settle(None, policy, "alpha", KEY, 3.0, {"cost": 3.0}))  # counted, logged, no raise
    assert [e["event"] for e in logs] == ["budget_unchecked", "spend_unrecorded"]
    assert _value(metrics, "tiergate_budget_unchecked_total", tenant="alpha") == 1
    assert _value(metrics, "tiergate_spend_ledger_errors_total", op="settle") == 1


def test_a_soft_only_budget_never_refuses_even_with_the_ledger_down():
    policy = _policy("  tenants:\n    alpha: {soft: 1}\n")
    budgets = Budgets(GatewayMetrics(CollectorRegistry()), _Down(), clock=lambda: NOW)
    assert asyncio.run(budgets.reserve(policy, "alpha", KEY, 1e6)) == (None, False)


def test_usage_is_the_keys_own_spend_and_what_its_budgets_have_left():
    budgets, _ = _budgets()

    async def run() -> None:
        for key, cost in ((KEY, 12.0), (OTHER, 40.0), (KEY, 3.0)):
            hold, _ = await budgets.reserve(PLAIN, "alpha", key, cost)
            await budgets.settle(hold, PLAIN, "alpha", key, cost,
                                 {"cost": cost, "requests": 1, "prompt": 7, "completion": 2})
        mine = await budgets.usage(PLAIN, "alpha", KEY)
        assert (mine.spend, mine.requests, mine.prompt_tokens, mine.completion_tokens) == (15.0, 2, 14, 4)
        assert mine.period.id == "2026-W48"  # the key's own budget's period
        assert mine.budgets["key"]["remaining"] == 15.0 and mine.budgets["tenant"]["remaining"] == 45.0
        theirs = await budgets.usage(PLAIN, "alpha", OTHER)
        assert theirs.spend == 40.0 and set(theirs.budgets) == {"tenant"} and theirs.period.id == "2026-11-27"

    asyncio.run(run())


def test_the_ledger_names_a_key_by_a_prefix_of_its_digest_never_the_key():
    assert key_id(KEY) == KEY[:16] and "key-alpha" not in key_id(KEY)


class _Counting(_Down):
    """A ledger that is down, counting how often it is asked."""

    def __init__(self) -> None:
        self.asked = 0

    async def reserve(self, counters: Sequence[Counter], amount: int) -> tuple[int, int] | None:
        self.asked += 1
        raise ConnectionError("redis down")


def test_after_a_failure_the_ledger_is_not_asked_again_for_a_moment_and_the_logs_stay_quiet():
    """A Redis that hangs must not add its timeout to every request, nor an outage flood the logs: after a failure
    the next second's requests fail at once (counted, one log line), then the ledger is asked again."""
    policy = _policy("  on_redis_down: allow\n  tenants:\n    alpha: {hard: 1}\n")
    metrics = GatewayMetrics(CollectorRegistry())
    ledger, now = _Counting(), [100.0]
    budgets = Budgets(metrics, ledger, clock=lambda: NOW, monotonic=lambda: now[0])

    async def run() -> None:
        for _ in range(5):
            assert await budgets.reserve(policy, "alpha", KEY, 1.0) == (None, False)
        assert ledger.asked == 1
        now[0] += 1.01
        assert await budgets.reserve(policy, "alpha", KEY, 1.0) == (None, False)
        assert ledger.asked == 2

    with capture_logs() as logs:
        asyncio.run(run())
    assert [e["event"] for e in logs] == ["budget_unchecked", "budget_unchecked"]  # once per second
    assert _value(metrics, "tiergate_budget_unchecked_total", tenant="alpha") == 6
    assert _value(metrics, "tiergate_spend_ledger_errors_total", op="reserve") == 6
