"""Dispatch's bookkeeping: the errors when no backend can take a request, and the tier slots and endpoint in-flight
counts given back exactly once whichever way a request leaves (fakes at the pool and upstream boundaries; test_app
covers real ones)."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from tiergate.core.errors import OpenAIError
from tiergate.core.pool import Endpoint
from tiergate.core.types import Decision, Features, Priority, Timeouts
from tiergate.gateway.admission import Admission
from tiergate.gateway.dispatch import Dispatcher
from tiergate.gateway.metrics import GatewayMetrics
from tiergate.gateway.quarantine import Quarantine
from tiergate.gateway.tiers import Tier
from tiergate.gateway.upstream import FailureKind, UpstreamClient, UpstreamFailure
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

    def fingerprint(self) -> str:
        return "fp-1"


async def _open(tiers: dict[str, Tier], decision: Decision) -> OpenAIError:
    dispatcher = Dispatcher(UpstreamClient(), GatewayMetrics(CollectorRegistry()))
    with pytest.raises(OpenAIError) as failed:
        await dispatcher.open(tiers=tiers, request=None, features=FEATURES, decision=decision, path="/v1/chat/completions",
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


# ---- every way out gives the tier's slot and the endpoint's in-flight count back, once -------------------------


class _Pool:
    """A tier's endpoints, all candidates, best first; what dispatch reported of each."""

    def __init__(self, tier: str, *names: str) -> None:
        self.eps = [Endpoint(n, f"http://{n}", "m", tier) for n in names]
        self.reports: list[tuple[str, bool]] = []
        self.sources: list[str | None] = []

    def candidates(self, request, features):
        return list(self.eps)

    def endpoints(self):
        return list(self.eps)

    def report(self, ep: Endpoint, ok: bool, source: str | None = None) -> None:
        self.reports.append((ep.id, ok))
        self.sources.append(source)


class _Response:
    closed = False

    def close(self) -> None:
        self.closed = True


class _Upstream:
    """Answers each endpoint as told: "ok", "5xx", "4xx", "capability", "break" (the connection dropped before
    the answer began), "refuse" (the connection refused), or "hang" (until cancelled)."""

    def __init__(self, **how: str) -> None:
        self.how = how
        self.posted: list[str] = []
        self.hanging = asyncio.Event()

    async def post(self, ep, path, body, timeouts, request_id, stream=False):
        self.posted.append(ep.id)
        how = self.how[ep.id]
        if how == "ok":
            return _Response()
        if how == "hang":
            self.hanging.set()
            await asyncio.Event().wait()
        kind, status = {"5xx": (FailureKind.HTTP_5XX, 502), "4xx": (FailureKind.HTTP_4XX, 400),
                        "capability": (FailureKind.CAPABILITY, 400), "break": (FailureKind.PROTOCOL, 502),
                        "refuse": (FailureKind.CONNECT, 503)}[how]
        raise UpstreamFailure(f"{ep.id} said {how}", kind=kind, status=status)


def _leaks(routes: dict[str, Tier], metrics: GatewayMetrics) -> list[str]:
    """Whatever is still counted as taken: tier slots, endpoint in-flight counts, the in-flight gauge."""
    left = [f"{name}: {r.admission.inflight} slot(s)" for name, r in routes.items() if r.admission.inflight]
    left += [f"{ep.id}: {ep.inflight} in flight" for r in routes.values() for ep in r.pool.endpoints() if ep.inflight]
    left += [f"{name}: gauge {metrics.inflight.labels(name)._value.get()}" for name in routes
             if metrics.inflight.labels(name)._value.get()]
    return left


def _two_tiers(edge: tuple[str, ...], cloud: tuple[str, ...]) -> dict[str, Tier]:
    return {"edge": Route("edge", _Pool("edge", *edge), Admission(lambda: 4)),
            "cloud": Route("cloud", _Pool("cloud", *cloud), Admission(lambda: 4))}


def _dispatcher(routes: dict[str, Tier], quarantine: Quarantine | None = None,
                **how: str) -> tuple[Dispatcher, _Upstream, GatewayMetrics]:
    upstream, metrics = _Upstream(**how), GatewayMetrics(CollectorRegistry())
    return Dispatcher(upstream, metrics, quarantine), upstream, metrics  # type: ignore[arg-type]


def _go(dispatcher: Dispatcher, routes: dict[str, Tier]):
    return dispatcher.open(tiers=routes, request=None, features=FEATURES, decision=Decision(rule="r", tier="edge",
                           fallbacks=("cloud",)), path="/v1/chat/completions", body=_Body(), request_id="r1",
                           stream=False)


async def test_an_accepted_request_holds_its_slot_and_endpoint_until_finished_then_gives_them_back_once():
    routes = _two_tiers(("e1", "e2"), ("c1",))
    dispatcher, upstream, metrics = _dispatcher(routes, e1="5xx", e2="ok", c1="ok")
    attempt = await _go(dispatcher, routes)
    assert (attempt.tier, attempt.endpoint.id) == ("edge", "e2")  # e1 failed, the next endpoint took it
    assert _leaks(routes, metrics) == ["edge: 1 slot(s)", "e2: 1 in flight", "edge: gauge 1.0"]
    attempt.finish()
    attempt.finish()  # a second finish gives nothing back twice
    assert _leaks(routes, metrics) == []
    assert routes["edge"].pool.reports == [("e1", False), ("e2", True)]


async def test_every_endpoint_failing_leaves_nothing_taken():
    routes = _two_tiers(("e1", "e2"), ("c1",))
    dispatcher, upstream, metrics = _dispatcher(routes, e1="5xx", e2="5xx", c1="5xx")
    with pytest.raises(OpenAIError) as failed:
        await _go(dispatcher, routes)
    assert failed.value.status == 502 and upstream.posted == ["e1", "e2", "c1"]
    assert _leaks(routes, metrics) == []


async def test_a_backend_verdict_on_the_request_ends_it_and_leaves_nothing_taken():
    routes = _two_tiers(("e1", "e2"), ("c1",))
    dispatcher, upstream, metrics = _dispatcher(routes, e1="4xx", e2="ok", c1="ok")
    with pytest.raises(OpenAIError) as failed:
        await _go(dispatcher, routes)
    assert failed.value.status == 400 and upstream.posted == ["e1"]
    assert _leaks(routes, metrics) == []


async def test_a_capability_failure_falls_to_the_next_tier_and_leaves_the_first_untaken():
    routes = _two_tiers(("e1", "e2"), ("c1",))
    dispatcher, upstream, metrics = _dispatcher(routes, e1="capability", e2="ok", c1="ok")
    attempt = await _go(dispatcher, routes)
    assert (attempt.tier, attempt.fallback_from) == ("cloud", "edge")
    assert upstream.posted == ["e1", "c1"]  # the tier's other endpoints are alike: skipped
    assert _leaks(routes, metrics) == ["cloud: 1 slot(s)", "c1: 1 in flight", "cloud: gauge 1.0"]
    attempt.finish()
    assert _leaks(routes, metrics) == []


async def test_a_request_cancelled_while_its_backend_works_leaves_nothing_taken():
    routes = _two_tiers(("e1", "e2"), ("c1",))
    dispatcher, upstream, metrics = _dispatcher(routes, e1="5xx", e2="hang", c1="ok")
    task = asyncio.create_task(_go(dispatcher, routes))
    await asyncio.wait_for(upstream.hanging.wait(), 5)
    assert _leaks(routes, metrics) == ["edge: 1 slot(s)", "e2: 1 in flight", "edge: gauge 1.0"]
    task.cancel()  # the client went away
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _leaks(routes, metrics) == []
    assert not routes["edge"].pool.eps[1].waiting  # nor is it still watched for a lost backend


async def test_a_gateway_shutting_down_refuses_before_posting_and_leaves_nothing_taken():
    routes = _two_tiers(("e1",), ("c1",))
    dispatcher, upstream, metrics = _dispatcher(routes, e1="ok", c1="ok")
    dispatcher.abort_all("stopping")
    with pytest.raises(OpenAIError) as failed:
        await _go(dispatcher, routes)
    assert failed.value.code == "shutting_down" and upstream.posted == []
    assert _leaks(routes, metrics) == []


# ---- a request that breaks backends ---------------------------------------------------------------------------------


def _three_tiers() -> dict[str, Tier]:
    return {"edge": Route("edge", _Pool("edge", "e1", "e2"), Admission(lambda: 4)),
            "cloud": Route("cloud", _Pool("cloud", "c1"), Admission(lambda: 4))}


async def test_a_request_that_breaks_a_backend_gets_one_other_and_is_quarantined_when_it_breaks_that_too():
    routes = _three_tiers()
    quarantine = Quarantine()
    dispatcher, upstream, metrics = _dispatcher(routes, quarantine, e1="break", e2="break", c1="ok")
    with pytest.raises(OpenAIError) as failed:
        await _go(dispatcher, routes)
    assert failed.value.status == 400 and failed.value.code == "request_quarantined"
    assert upstream.posted == ["e1", "e2"]  # never a third backend, though the cloud was fine
    assert quarantine.holds("fp-1") and _leaks(routes, metrics) == []
    with pytest.raises(OpenAIError) as again:  # the same request again: refused before any backend sees it
        await _go(dispatcher, routes)
    assert again.value.code == "request_quarantined" and upstream.posted == ["e1", "e2"]
    assert [metrics.poison.labels(o)._value.get() for o in ("retried", "quarantined", "refused")] == [1, 1, 1]


async def test_one_break_is_not_evidence_the_other_backend_answers():
    routes = _three_tiers()
    dispatcher, upstream, _ = _dispatcher(routes, e1="break", e2="ok", c1="ok")
    attempt = await _go(dispatcher, routes)
    assert attempt.endpoint.id == "e2" and upstream.posted == ["e1", "e2"]
    attempt.finish()


async def test_after_a_break_only_one_other_backend_gets_the_request_whatever_it_fails_of():
    """A refused connection never reached the backend, so it does not use up the one other try; a 5xx does."""
    routes = _three_tiers()
    dispatcher, upstream, _ = _dispatcher(routes, e1="break", e2="refuse", c1="5xx")
    with pytest.raises(OpenAIError) as failed:
        await _go(dispatcher, routes)
    assert failed.value.status == 502 and upstream.posted == ["e1", "e2", "c1"]


async def test_failures_are_reported_with_the_tenant_whose_request_it_was():
    routes = _three_tiers()
    dispatcher, _, _ = _dispatcher(routes, e1="5xx", e2="ok", c1="ok")
    (await _go(dispatcher, routes)).finish()
    assert routes["edge"].pool.sources == ["t", "t"]  # FEATURES.tenant, for the failure and the success
