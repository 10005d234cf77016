"""Dispatch's bookkeeping when no backend can take a request (fakes at the pool boundary; test_app covers real ones)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from tiergate.core.errors import OpenAIError
from tiergate.core.types import Decision, Features, Priority, Timeouts
from tiergate.gateway.admission import Admission
from tiergate.gateway.dispatch import Dispatcher
from tiergate.gateway.metrics import GatewayMetrics
from tiergate.gateway.tiers import Tier
from tiergate.gateway.upstream import UpstreamClient
from tiergate.policies.tier_config import TierConfig

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


class _EmptyPool:
    """A tier whose every backend is down (or that has none yet): no candidates."""

    def candidates(self, request, features):
        return []

    def endpoints(self):
        return []


class _Pool1(_EmptyPool):
    """One (never contacted) candidate: the tier is reachable but its admission is full."""

    def candidates(self, request, features):
        return [object()]


FEATURES = Features(prompt_tokens=3, priority=Priority.NORMAL, complexity=0.1, requested_model="auto", tenant="t")


def Route(name: str, pool, admission: Admission) -> Tier:  # noqa: N802 - reads as the record it builds
    return Tier(name, TierConfig(name=name, kind="edge", model=name), pool, admission)


class _Body:
    """The smallest `dispatch.Body`: the same bytes for every endpoint."""

    sent = False

    def for_endpoint(self, ep) -> bytes:
        return b"{}"

    def mark_sent(self) -> None:
        self.sent = True


async def _open(tiers: dict[str, Tier], decision: Decision) -> OpenAIError:
    dispatcher = Dispatcher(UpstreamClient(), tiers, GatewayMetrics(CollectorRegistry()))
    with pytest.raises(OpenAIError) as failed:
        await dispatcher.open(request=None, features=FEATURES, decision=decision, path="/v1/chat/completions",
                              body=_Body(), request_id="r1", stream=False)
    return failed.value


async def test_a_tier_without_healthy_backends_is_a_503_that_says_when_to_retry():
    routes = {"edge": Route("edge", _EmptyPool(), Admission(lambda: 1))}
    err = await _open(routes, Decision(rule="default", tier="edge"))
    assert err.status == 503 and err.code == "tier_unavailable"
    assert err.headers["retry-after"] == "1"
    assert routes["edge"].admission.inflight == 0  # nothing was taken


async def test_when_every_tier_fails_the_error_names_each_of_them():
    saturated = Admission(lambda: 1)
    assert await saturated.acquire(Priority.CRITICAL, 0)
    routes = {"edge": Route("edge", _EmptyPool(), Admission(lambda: 1)),
              "cloud": Route("cloud", _Pool1(), saturated)}
    no_queue = Timeouts(queue_s=0)
    err = await _open(routes, Decision(rule="default", tier="edge", fallbacks=("cloud",), timeouts=no_queue))
    assert err.status == 429 and err.code == "tier_saturated"  # the last tier's verdict decides the status
    assert "tier `edge`" in err.message and "Tier `cloud` is saturated" in err.message
    assert saturated.inflight == 1  # the shed request took nothing
