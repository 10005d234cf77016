"""Shadow checks' bookkeeping: room, draining, a tier that fails, shutdown (fakes at the dispatcher and cache
boundary; tests/integration/test_cache_gateway.py runs them through a real gateway on Redis 8)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.support.waiting import eventually
from tiergate.core.errors import OpenAIError
from tiergate.gateway.metrics import GatewayMetrics
from tiergate.gateway.settlement import Settlements
from tiergate.gateway.shadow import ShadowChecks

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


class _Dispatcher:
    """Holds every request until `release` is set, then fails it as a tier would (no backend answered)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.opened = 0

    async def open(self, **_: Any) -> Any:
        self.opened += 1
        await self.release.wait()
        raise OpenAIError(503, "Tier `cloud`: no backend available.", type="upstream_error", code="upstream_down")


class _Cache:
    def __init__(self) -> None:
        self.stored: list[Any] = []

    async def store(self, *args: Any) -> bool:
        self.stored.append(args)
        return True


@dataclass
class _Gateway:
    """What the checks are given: the dispatcher, metrics, a settlement for each check, the cache, draining."""

    concurrency: int = 4
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    metrics: GatewayMetrics = field(init=False)
    dispatcher: _Dispatcher = field(default_factory=_Dispatcher)
    cache: _Cache | None = field(default_factory=_Cache)
    draining: bool = False
    retired: bool = False  # the hit's routing version is no longer held by anything
    held: int = 0  # claims on the routing version the checks hold now

    def __post_init__(self) -> None:
        self.metrics = GatewayMetrics(self.registry)

    def checks(self) -> ShadowChecks:
        settlements = Settlements(None, None, self.metrics, lambda: self.cache, None)  # type: ignore[arg-type]
        return ShadowChecks(dispatcher=self.dispatcher, metrics=self.metrics,  # type: ignore[arg-type]
                            settlements=settlements, cache=lambda: self.cache,  # type: ignore[arg-type]
                            draining=lambda: self.draining, concurrency=self.concurrency,
                            hold=self.hold)  # type: ignore[arg-type]

    def hold(self, routing: object) -> _Hold | None:
        return None if self.retired else _Hold(self)


class _Hold:
    """A claim on the hit's routing version, counted while a check holds it."""

    def __init__(self, gw: _Gateway) -> None:
        self._gw, self.routing = gw, _Routing()
        gw.held += 1

    def release(self) -> None:
        self._gw.held -= 1


class _Routing:
    tiers: dict = {}


class _Request:
    kind = "chat"


@dataclass
class _Ctx:
    request_id: str
    req: _Request = field(default_factory=_Request)
    raw: dict = field(default_factory=dict)
    features: None = None
    decision: None = None
    routing: None = None

    def max_tokens(self) -> int:
        return 16


def _count(gw: _Gateway, result: str) -> float:
    return gw.registry.get_sample_value("tiergate_cache_shadow_checks_total", {"result": result}) or 0.0


async def test_checks_beyond_the_room_are_dropped_and_a_failed_tier_is_counted() -> None:
    gw = _Gateway(concurrency=2)
    shadow = gw.checks()
    for i in range(3):
        await shadow.start(_Ctx(f"r{i}"), None)  # type: ignore[arg-type]
    await eventually(lambda: gw.dispatcher.opened == 2, "two checks at the tier")
    assert _count(gw, "dropped") == 1  # the third found both places taken
    gw.dispatcher.release.set()
    await eventually(lambda: shadow.running == 0, "the checks ended")
    assert _count(gw, "failed") == 2 and _count(gw, "dropped") == 1
    assert gw.cache.stored == [] and _count(gw, "checked") == 0  # nothing to compare with: nothing stored
    assert gw.held == 0  # each check gave its routing version back
    await shadow.start(_Ctx("r3"), None)  # type: ignore[arg-type]
    await eventually(lambda: gw.dispatcher.opened == 3, "room again once they ended")


async def test_no_check_starts_while_draining_and_shutdown_cancels_the_running_ones() -> None:
    gw = _Gateway()
    shadow = gw.checks()
    await shadow.start(_Ctx("r0"), None)  # type: ignore[arg-type]
    await eventually(lambda: gw.dispatcher.opened == 1, "the check at the tier")
    gw.draining = True
    await shadow.start(_Ctx("r1"), None)  # type: ignore[arg-type]
    assert _count(gw, "dropped") == 1
    await shadow.stop()  # the held check is cancelled, not waited for
    assert shadow.running == 0 and _count(gw, "failed") == 0 and _count(gw, "checked") == 0
    assert gw.dispatcher.opened == 1


async def test_a_hit_whose_routing_version_is_gone_is_not_checked_under_another() -> None:
    """The policy was reloaded and the hit's version let go before its check could start: dropped, not dispatched
    to the new version's tiers (the hit was decided under the old one)."""
    gw = _Gateway(retired=True)
    shadow = gw.checks()
    await shadow.start(_Ctx("r0"), None)  # type: ignore[arg-type]
    assert _count(gw, "dropped") == 1 and shadow.running == 0 and gw.dispatcher.opened == 0
