"""The in-process ledger: a reservation takes from every counter or none, settling corrects it, records expire.
(The Redis ledger runs the same checks in `tests/integration/test_budgets_redis.py`.)"""

from __future__ import annotations

import asyncio

import pytest

from tiergate.gateway.ledger import NANO, Counter, LocalLedger, counter_key, day_key


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_keys_share_the_tenants_hash_tag():
    assert counter_key("tg:spend", "acme", "key:0123", "2026-11") == "tg:spend:{acme}:budget:key:0123:2026-11"
    assert day_key("tg:spend", "acme", "2026-11-27") == "tg:spend:{acme}:day:2026-11-27"


def test_a_reservation_takes_from_every_counter_or_from_none():
    ledger = LocalLedger(Clock())
    tenant, key = Counter("t", 10 * NANO, 60), Counter("k", 3 * NANO, 60)

    async def run() -> None:
        assert await ledger.reserve([tenant, key], 2 * NANO) is None
        assert await ledger.reserve([tenant, key], 2 * NANO) == (1, 2 * NANO)  # the key's 3 refuses: nothing taken
        assert await ledger.reserve([tenant], 8 * NANO) is None  # the tenant still had 8 left
        assert await ledger.reserve([tenant], 1) == (0, 10 * NANO)
        assert (await ledger.read(["t", "k"], [], []))[0] == [10 * NANO, 2 * NANO]

    asyncio.run(run())


def test_a_counter_without_a_hard_limit_only_counts():
    ledger = LocalLedger(Clock())
    assert asyncio.run(ledger.reserve([Counter("soft", None, 60)], 10**15)) is None


def test_settling_corrects_the_counters_and_adds_to_the_days_record():
    ledger = LocalLedger(Clock())
    c = Counter("t", 10 * NANO, 60)

    async def run() -> None:
        await ledger.reserve([c], 4 * NANO)
        assert await ledger.settle([c], -3 * NANO, "d1", {"cost": 1.0, "requests": 1}, 3600) == [NANO]
        await ledger.settle([], 0, "d1", {"cost": 0.5, "requests": 1}, 3600)
        await ledger.settle([], 0, "d2", {"cost": 2.0}, 3600)
        values, sums = await ledger.read(["t"], ["d1", "d2", "d3"], ["cost", "requests", "absent"])
        assert values == [NANO] and sums == [pytest.approx(3.5), 2.0, 0.0]

    asyncio.run(run())


def test_counters_and_records_expire():
    clock = Clock()
    ledger = LocalLedger(clock)
    c = Counter("t", 10 * NANO, 60)

    async def run() -> None:
        await ledger.reserve([c], 9 * NANO)
        await ledger.settle([], 0, "d1", {"cost": 1.0}, 120)
        clock.now += 61
        assert await ledger.reserve([c], 9 * NANO) is None  # the old period's counter is gone
        clock.now += 60
        assert (await ledger.read([], ["d1"], ["cost"]))[1] == [0.0]

    asyncio.run(run())


def test_expired_entries_are_pruned_so_the_ledger_stays_bounded():
    clock = Clock()
    ledger = LocalLedger(clock)

    async def run() -> None:
        for i in range(3000):
            await ledger.reserve([Counter(f"c{i}", None, 10)], 1)
            clock.now += 1
        assert len(ledger._counters) < 1100

    asyncio.run(run())
