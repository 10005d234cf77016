"""Budgets in money, enforced at admission, and spend recorded per tenant, key, tier and rule.

A request under a budget reserves its worst case before any backend sees it (`worst_case`: its prompt and the
most its answer may use, on the costliest tier it may reach; a cascade, its first attempt plus the costlier
escalation), from every budget it is under (its tenant's, its key's) in one atomic step of the ledger
(`gateway.ledger`). Its settlement then corrects the reservation to what it really cost, whichever way it ended,
and records that cost in the day's spend record. So concurrent requests on any number of replicas cannot
overshoot a hard limit: the worst cases of those admitted always fit.

Past the hard limit a request is refused with a 429 of type `insufficient_quota` (what OpenAI sends when a quota
is spent; clients do not retry it) and code `budget_exceeded`, Retry-After at the end of the budget's period, and
`x-should-retry: false` (the `openai` SDK would otherwise retry); with `on_exceed: downgrade`, it is answered by
the cheaper `downgrade_to` tier instead, while that one's worst case still fits. A soft limit, and a hard one
reached, alert once per budget and period on each replica: a log line and `tiergate_budget_alerts_total`.

The ledger unreachable (Redis down or slow): a request under a hard budget is refused with a 503
`budget_unavailable` (`on_redis_down: refuse`, the default) or admitted unchecked (`allow`), counted in
`tiergate_budget_unchecked_total` and logged; settlements that fail are counted and logged. After a failure the
ledger is not asked again for `pause_s` (a second), as the rate limits do, so that a Redis that hangs does not add
its timeout to every request; and each kind of failure is logged at most once per `pause_s` (the metrics count
every one), so that an outage does not flood the logs.

Tested in `tests/gateway/test_budgets.py` and, against real Redis, `tests/integration/test_budgets_redis.py`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import structlog

from tiergate.core.errors import OpenAIError
from tiergate.core.types import Decision
from tiergate.gateway.ledger import NANO, Counter, Ledger, counter_key, day_key
from tiergate.gateway.metrics import GatewayMetrics
from tiergate.policies.budgets import Budget, BudgetsConfig, OnExceed, OnRedisDown, Period, PeriodSpan, span
from tiergate.policies.model import Policy

__all__ = ["Budgets", "Hold", "Usage", "key_id", "worst_case"]

log = structlog.get_logger("tiergate.gateway")
_T = TypeVar("_T")
_DEFAULT = BudgetsConfig()
_DAY_S = 86_400
_UNCHECKED = (-1, 0)  # the ledger could not be asked, and the request goes on anyway


class _LedgerPaused(Exception):
    """The ledger failed moments ago: this call fails at once, without waiting for Redis again."""


def key_id(digest: str) -> str:
    """How the ledger names a key: the first 16 hex digits of its SHA-256 (never the key itself)."""
    return digest[:16]


def worst_case(policy: Policy, decision: Decision, prompt_tokens: int, max_tokens: int | None) -> float:
    """The most a request may cost: its prompt and its answer's max_tokens (else what is left of each tier's
    context) on the costliest tier it may be answered by; a cascade adds its first attempt to that."""
    costs = policy.costs
    if costs is None or decision.tier is None:
        return 0.0

    def on(tier: str) -> float:
        answer = max_tokens
        if answer is None:
            cfg = policy.tiers.get(tier)
            answer = max(0, cfg.max_context - prompt_tokens) if cfg is not None else 0
        return costs.cost(tier, prompt_tokens, answer)

    if decision.cascade is not None:
        later = {decision.cascade.escalate_to, *decision.fallbacks}
        return on(decision.tier) + max(on(t) for t in later)
    return max(on(t) for t in decision.tiers)


@dataclass(frozen=True, slots=True)
class _Scope:
    name: str  # `tenant` or `key`
    budget: Budget
    period: PeriodSpan
    counter: Counter


@dataclass(frozen=True, slots=True)
class _Plan:
    """A budget scope as it stands for a whole UTC day: its counter's key and hard limit, and when the counter
    may expire (epoch seconds: a day after its period ends)."""

    name: str
    budget: Budget
    period: PeriodSpan
    key: str
    hard: int | None
    expires_at: float


@dataclass(slots=True)
class Hold:
    """What a request reserved (`amount`, in `NANO`) from the counters of the budgets it is under."""

    tenant: str
    scopes: tuple[_Scope, ...]
    amount: int


@dataclass(frozen=True, slots=True)
class Usage:
    """One key's usage over a period, and what its budgets have left (None: no such budget)."""

    period: PeriodSpan
    currency: str
    spend: float
    requests: int
    prompt_tokens: int
    completion_tokens: int
    budgets: dict[str, dict[str, float | str | None]]


class Budgets:
    def __init__(self, metrics: GatewayMetrics, ledger: Ledger, *, prefix: str = "tg:spend", timeout_s: float = 0.25,
                 clock: Callable[[], float] = time.time, pause_s: float = 1.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._metrics = metrics
        self._ledger = ledger
        self._prefix = prefix
        self._timeout = timeout_s
        self._clock = clock
        self._alerted: set[tuple[str, str]] = set()  # (counter, level): alerted once per budget and period
        self._spans: dict[tuple[Period, dt.date], PeriodSpan] = {}  # the periods of today, computed once
        self._plans: dict[tuple[str, str | None, int], tuple[Budget, tuple[_Plan, ...]]] = {}  # see _scopes
        self._days: dict[tuple[str, int], str] = {}  # (tenant, UTC day number) -> its record's ledger key
        self._pause_s = pause_s
        self._monotonic = monotonic
        self._skip_until = 0.0  # monotonic: the ledger failed moments ago, do not wait for it again yet
        self._logged: dict[str, float] = {}  # failure event -> when it was last logged (monotonic)

    async def _bounded(self, op: Awaitable[_T], factor: float = 1.0) -> _T:
        """`op` within the timeout when the ledger is shared (Redis); in process it cannot hang, and an
        `asyncio.timeout` (a timer on the loop) would be most of what bookkeeping costs."""
        if not self._ledger.shared:
            return await op
        if self._monotonic() < self._skip_until:
            if asyncio.iscoroutine(op):
                op.close()  # never awaited: the ledger is not asked
            raise _LedgerPaused("the ledger failed moments ago")
        try:
            async with asyncio.timeout(self._timeout * factor):
                return await op
        except Exception:
            self._skip_until = self._monotonic() + self._pause_s
            raise

    def _quietly(self, event: str) -> bool:
        """Whether to log failure `event` now: at most once per pause."""
        now = self._monotonic()
        if now < self._logged.get(event, -math.inf) + self._pause_s:
            return False
        self._logged[event] = now
        return True

    def _span(self, period: Period, now: dt.datetime) -> PeriodSpan:
        key = (period, now.date())
        found = self._spans.get(key)
        if found is None:
            if len(self._spans) > 64:
                self._spans.clear()
            found = self._spans[key] = span(period, now)
        return found

    def _scopes(self, policy: Policy, tenant: str, key: str | None, ts: float) -> tuple[_Scope, ...]:
        """The budgets a request of `tenant` with `key` is under at `ts` (epoch seconds). What they are holds for a
        whole UTC day, so it is worked out once a day per tenant and key (and again after a policy reload); only
        each counter's time to live changes from one request to the next."""
        cfg = policy.budgets
        tb = cfg.tenants.get(tenant) if cfg is not None else None
        if tb is None:
            return ()
        memo = (tenant, key, int(ts // _DAY_S))
        found = self._plans.get(memo)
        if found is None or found[0] is not tb:
            now = dt.datetime.fromtimestamp(ts, dt.UTC)
            plans = [self._plan("tenant", tenant, "tenant", tb, now)]
            kb = tb.keys.get(key) if key is not None else None
            if kb is not None and key is not None:
                plans.append(self._plan("key", tenant, f"key:{key_id(key)}", kb, now))
            if len(self._plans) > 4096:
                self._plans.clear()
            found = self._plans[memo] = (tb, tuple(plans))
        return tuple(_Scope(p.name, p.budget, p.period, Counter(p.key, p.hard, math.ceil(p.expires_at - ts)))
                     for p in found[1])

    def _plan(self, name: str, tenant: str, scope: str, budget: Budget, now: dt.datetime) -> _Plan:
        period = self._span(budget.period, now)
        hard = None if budget.hard is None else round(budget.hard * NANO)
        return _Plan(name, budget, period, counter_key(self._prefix, tenant, scope, period.id), hard,
                     period.end.timestamp() + _DAY_S)

    def _day_key(self, tenant: str, ts: float) -> str:
        """The ledger key of `tenant`'s record for the UTC day of `ts`, named once a day."""
        memo = (tenant, int(ts // _DAY_S))
        found = self._days.get(memo)
        if found is None:
            if len(self._days) > 4096:
                self._days.clear()
            day = dt.datetime.fromtimestamp(ts, dt.UTC).date().isoformat()
            found = self._days[memo] = day_key(self._prefix, tenant, day)
        return found

    async def reserve(self, policy: Policy, tenant: str, key: str | None, worst: float,
                      downgrade: Callable[[], float] | None = None) -> tuple[Hold | None, bool]:
        """Reserve `worst` from the request's budgets: (its hold, False); or, over a hard limit with
        `on_exceed: downgrade`, `downgrade()` (the downgrade tier's worst case) instead: (its hold, True); or a 429.
        (None, False): no budget applies, or the ledger is down and `on_redis_down: allow`."""
        ts = self._clock()
        scopes = self._scopes(policy, tenant, key, ts)
        if not scopes:
            return None, False
        amount = math.ceil(worst * NANO)
        counters = [s.counter for s in scopes]
        refused = await self._reserve(policy, tenant, scopes, counters, amount)
        if refused is _UNCHECKED:
            return None, False
        if refused is None:
            return Hold(tenant, scopes, amount), False
        tb = policy.budgets.tenants[tenant] if policy.budgets is not None else None
        scope, spent = scopes[refused[0]], refused[1]
        if tb is not None and tb.on_exceed is OnExceed.DOWNGRADE and downgrade is not None:
            cheaper = math.ceil(downgrade() * NANO)
            again = await self._reserve(policy, tenant, scopes, counters, cheaper) if cheaper < amount else refused
            if again is None or again is _UNCHECKED:
                self._metrics.child(self._metrics.budget_refused, tenant, scope.name, "downgraded").inc()
                log.info("budget_downgraded", tenant=tenant, scope=scope.name, to=tb.downgrade_to)
                return (Hold(tenant, scopes, cheaper) if again is None else None), True
        self._metrics.child(self._metrics.budget_refused, tenant, scope.name, "refused").inc()
        self._alert(tenant, scope, "hard", spent)
        raise _exceeded(policy, tenant, scope, worst, dt.datetime.fromtimestamp(ts, dt.UTC))

    async def _reserve(self, policy: Policy, tenant: str, scopes: tuple[_Scope, ...], counters: list[Counter],
                       amount: int) -> tuple[int, int] | None:
        """None: taken; else (index, value) of the counter that refused, or `_UNCHECKED` (the ledger is down and
        the policy allows that; or no budget here is hard)."""
        try:
            return await self._bounded(self._ledger.reserve(counters, amount))
        except Exception as exc:
            self._metrics.ledger_errors.labels("reserve").inc()
            cfg = policy.budgets or _DEFAULT
            if cfg.on_redis_down is OnRedisDown.REFUSE and any(s.counter.hard is not None for s in scopes):
                if self._quietly("budget_unavailable"):
                    log.error("budget_unavailable", tenant=tenant, error=repr(exc), on_redis_down="refuse")
                raise OpenAIError(503, "The spend ledger cannot be read, so this tenant's budget cannot be "
                                       "checked; retry shortly.", type="server_error", code="budget_unavailable",
                                  headers={"retry-after": "5"}) from None
            self._metrics.child(self._metrics.budget_unchecked, tenant).inc()
            if self._quietly("budget_unchecked"):
                log.warning("budget_unchecked", tenant=tenant, error=repr(exc), on_redis_down="allow")
            return _UNCHECKED

    async def settle(self, hold: Hold | None, policy: Policy, tenant: str, key: str | None, charged: float,
                     fields: Mapping[str, float]) -> None:
        """Correct `hold` to `charged` (what the request cost its tenant) and add `fields` to the day's record."""
        if hold is None and not fields:
            return
        cfg = policy.budgets or _DEFAULT
        ts = self._clock()
        delta = round(charged * NANO) - hold.amount if hold is not None else 0
        scopes = hold.scopes if hold is not None else ()
        try:
            values = await self._bounded(self._ledger.settle(
                [s.counter for s in scopes], delta, self._day_key(tenant, ts),
                _keyed(fields, key), cfg.retention_days * _DAY_S), 4)
        except Exception as exc:
            self._metrics.ledger_errors.labels("settle").inc()
            if self._quietly("spend_unrecorded"):
                log.warning("spend_unrecorded", tenant=tenant, cost=charged, error=repr(exc))
            return
        for s, value in zip(scopes, values, strict=True):
            if s.budget.soft is not None and value >= s.budget.soft * NANO:
                self._alert(tenant, s, "soft", value)
            if s.counter.hard is not None and value >= s.counter.hard:
                self._alert(tenant, s, "hard", value)

    def _alert(self, tenant: str, scope: _Scope, level: str, value: int) -> None:
        mark = (scope.counter.key, level)
        if mark in self._alerted:
            return
        if len(self._alerted) > 10_000:
            self._alerted.clear()
        self._alerted.add(mark)
        self._metrics.child(self._metrics.budget_alerts, tenant, scope.name, level).inc()
        limit = scope.budget.soft if level == "soft" else scope.budget.hard
        log.warning("budget_alert", tenant=tenant, scope=scope.name, level=level, limit=limit,
                    spent=round(value / NANO, 9), period=scope.period.id)

    async def usage(self, policy: Policy, tenant: str, key: str, period: Period | None = None) -> Usage:
        """What key `key` (its SHA-256) spent in the current period (its budget's, else `period`, else the
        month) and what its budgets have left; nothing of another key's."""
        ts = self._clock()
        now = dt.datetime.fromtimestamp(ts, dt.UTC)
        scopes = self._scopes(policy, tenant, key, ts)
        own = next((s for s in scopes if s.name == "key"), scopes[0] if scopes else None)
        p = self._span(period or (own.budget.period if own is not None else Period.MONTH), now)
        k = key_id(key)
        names = [f"key|{k}|cost", f"key|{k}|requests", f"key|{k}|prompt", f"key|{k}|completion"]
        try:
            values, sums = await self._bounded(self._ledger.read(
                [s.counter.key for s in scopes], [day_key(self._prefix, tenant, d) for d in p.days()], names), 4)
        except Exception:
            self._metrics.ledger_errors.labels("read").inc()
            raise OpenAIError(503, "The spend ledger cannot be read; retry shortly.", type="server_error",
                              code="usage_unavailable", headers={"retry-after": "5"}) from None
        budgets: dict[str, dict[str, float | str | None]] = {}
        for s, value in zip(scopes, values, strict=True):
            hard = s.budget.hard
            budgets[s.name] = {"period": s.budget.period.value, "period_end": s.period.end.isoformat(),
                               "hard_limit": hard, "soft_limit": s.budget.soft,
                               "remaining": None if hard is None else round(max(0.0, hard - value / NANO), 9)}
        currency = policy.costs.currency if policy.costs is not None else ""
        return Usage(p, currency, round(sums[0], 9), int(sums[1]), int(sums[2]), int(sums[3]), budgets)


def _keyed(fields: Mapping[str, float], key: str | None) -> dict[str, float]:
    """The day's record fields, with the key's own (`key|<id>|...`) beside the tenant's."""
    out = dict(fields)
    if key is not None:
        for name, keyed in _key_fields(key):
            if name in fields:
                out[keyed] = fields[name]
    return out


@functools.lru_cache(maxsize=4096)
def _key_fields(key: str) -> tuple[tuple[str, str], ...]:
    """The day's record fields a key has its own copy of, and that copy's name (named once per key)."""
    k = key_id(key)
    return tuple((name, f"key|{k}|{name}") for name in ("cost", "requests", "prompt", "completion"))


def _exceeded(policy: Policy, tenant: str, scope: _Scope, worst: float, now: dt.datetime) -> OpenAIError:
    currency = policy.costs.currency if policy.costs is not None else ""
    whose = f"Tenant `{tenant}`" if scope.name == "tenant" else "This API key"
    left = scope.period.left_s(now)
    return OpenAIError(
        429, f"{whose} has reached its budget of {scope.budget.hard} {currency} for the {scope.budget.period.value} "
             f"(until {scope.period.end.isoformat()}); this request may cost up to {worst:.6f} {currency}.",
        type="insufficient_quota", code="budget_exceeded",
        headers={"retry-after": str(max(1, math.ceil(left))), "x-should-retry": "false"})
