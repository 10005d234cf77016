"""`gateway.settlement`: every request settles exactly once, whichever way it ends, with the right token charge.

The rules themselves are checked on a `Settlement` with fakes at its boundary (accounting, limiter, cache,
distiller); the paths (JSON, stream, cascade, cache hit, error, a client gone before or during its answer, a
shadow check) through a gateway run in process in front of instant backends, counting every settlement and every
charge."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.conftest import write_cascade_policy, write_policy
from tests.support.inprocess import in_process
from tests.support.instant_upstream import make_app
from tests.support.servers import aiohttp_server
from tests.support.waiting import eventually
from tiergate.cache import Route, SemanticCache
from tiergate.cache.types import CachedAnswer, CacheHit
from tiergate.core import tracing
from tiergate.core.errors import OpenAIError
from tiergate.core.types import Cascade, Decision, Features, Priority
from tiergate.gateway.auth import KeyRing, Tenant, hash_key
from tiergate.gateway.budgets import Budgets
from tiergate.gateway.context import Arrival, Finished, Outcome, UpstreamBody
from tiergate.gateway.ledger import LocalLedger
from tiergate.gateway.limits import Limiter, Reservation
from tiergate.gateway.metrics import GatewayMetrics
from tiergate.gateway.settings import Settings
from tiergate.gateway.settlement import AlreadySettled, Settlement, Settlements
from tiergate.policies.costs import CostsConfig, TierPrice
from tiergate.policies.loader import parse_policy

# A token limit far above what the tests use: every request reserves its budget and settles it.
TENANT = Tenant("alpha", Priority.NORMAL, tokens_per_minute=10**9)
KEYS = KeyRing({hash_key("key-alpha-1"): TENANT})
AUTH = {"Authorization": "Bearer key-alpha-1"}
FEATURES = Features(prompt_tokens=7, priority=Priority.NORMAL, complexity=0.1, requested_model="auto", tenant="alpha")


# ---- the rules, on one Settlement ------------------------------------------------------------------------------


@dataclass
class _Fakes:
    charged: list[int] = field(default_factory=list)
    accounted: list[tuple[str, Any]] = field(default_factory=list)
    stored: list[Any] = field(default_factory=list)
    served_ids: list[str] = field(default_factory=list)
    offered: list[Any] = field(default_factory=list)

    async def reserve(self, tenant: Tenant, tokens: int) -> Any:
        if tokens > 1000:
            raise OpenAIError(429, "over the token limit", code="token_limit_exceeded")
        return ("reserved", tokens)

    async def settle(self, reservation: Any, used: int) -> None:
        self.charged.append(used)

    refunded: list[Any] = field(default_factory=list)

    async def refund_request(self, slot: Any) -> None:
        self.refunded.append(slot)

    finished: list[Finished] = field(default_factory=list)  # every record handed to accounting

    def record(self, done: Finished) -> None:
        self.finished.append(done)
        self.accounted.append(("answered", (done.tier, done.status)))

    def refused(self, done: Finished, exc: OpenAIError) -> None:
        self.finished.append(done)
        self.accounted.append(("refused", exc.status))

    def gone(self, done: Finished) -> None:
        self.finished.append(done)
        self.accounted.append(("gone", done.prompt_tokens))

    routes: list[Any] = field(default_factory=list)  # the routing decision each store was keyed under

    async def store(self, *args: Any, route: Any = None) -> None:
        self.stored.append(args[3])
        self.routes.append(route)

    async def served(self, request_id: str, *args: Any) -> None:
        self.served_ids.append(request_id)

    async def offer(self, *args: Any) -> None:
        self.offered.append(args[-2:])

    def settlement(self, reserved: bool = True) -> tuple[Settlement, GatewayMetrics]:
        """A settlement, with its token budget reserved as the pipeline does once the policy has decided."""
        metrics = GatewayMetrics(CollectorRegistry())
        deps = Settlements(self, self, metrics, lambda: self, self)  # type: ignore[arg-type]
        settle = deps.open(Arrival.now("r1", "chat"))
        if reserved:
            asyncio.run(settle.reserve(SimpleNamespace(tenant=TENANT, requests=None), 100))  # type: ignore[arg-type]
        return settle, metrics


@dataclass
class _Ctx:
    """The part of a `RequestContext` settling reads."""

    request_id: str = "r1"
    arrival: Arrival = field(default_factory=lambda: Arrival.now("r1", "chat"))
    tenant: Tenant = TENANT
    features: Features = FEATURES
    decision: Decision = field(default_factory=lambda: Decision(rule="default", tier="edge"))
    req: Any = None
    raw: dict = field(default_factory=dict)
    policy: Any = field(default_factory=lambda: SimpleNamespace(costs=None, budgets=None))  # its version (no costs)
    held: Any = field(default_factory=lambda: SimpleNamespace(slot=None))

    def max_tokens(self) -> int:
        return 16

    def cache_route(self) -> Route:
        return Route.of(self.decision, self.max_tokens())


@pytest.fixture(autouse=True)
def _strict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Settlement, "strict", True)


def test_an_answer_is_counted_charged_stored_and_offered_once_and_a_second_settlement_is_refused() -> None:
    fakes = _Fakes()
    settle, _ = fakes.settlement()
    settle.add_spent(5)  # a cascade's thrown-away first attempt
    asyncio.run(settle.answered(_Ctx(), Outcome(cache="miss"), "edge", 200, 0.001, 7, 4, store="answer",
                                distill=("text", "model")))
    assert fakes.charged == [7 + 4 + 5] and fakes.accounted == [("answered", ("edge", 200))]
    assert fakes.stored == ["answer"] and fakes.offered == [("text", "model")] and settle.settled == "answered"
    assert fakes.routes == [Route(("edge",), 16)]  # keyed under the decision's tier and the effective budget
    with pytest.raises(AlreadySettled):
        asyncio.run(settle.answered(_Ctx(), Outcome(), "edge", 200, 0.001, 7, 4))
    assert fakes.charged == [16]


def test_a_second_settlement_outside_strict_mode_is_logged_and_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Settlement, "strict", False)
    fakes = _Fakes()
    settle, _ = fakes.settlement()
    asyncio.run(settle.hit(_Ctx(), Outcome(cache="hit-exact"), None, 0.001))  # type: ignore[arg-type]
    asyncio.run(settle.answered(_Ctx(), Outcome(), "edge", 200, 0.001, 7, 4))
    assert fakes.charged == [0] and fakes.accounted == [("answered", ("cache", 200))] and settle.settled == "hit"


def test_a_cache_hit_is_counted_and_recorded_as_served_but_not_charged() -> None:
    fakes = _Fakes()
    settle, _ = fakes.settlement()
    asyncio.run(settle.hit(_Ctx(), Outcome(cache="hit-exact"), None, 0.001))  # type: ignore[arg-type]
    assert fakes.charged == [0] and fakes.served_ids == ["r1"] and fakes.accounted == [("answered", ("cache", 200))]


def test_a_budget_refused_by_the_token_limit_gives_back_the_request_its_admission_counted() -> None:
    fakes = _Fakes()
    settle, _ = fakes.settlement(reserved=False)
    slot = SimpleNamespace(tenant=TENANT, requests=None)
    with pytest.raises(OpenAIError):
        asyncio.run(settle.reserve(slot, 5000))  # type: ignore[arg-type]
    assert fakes.refunded == [slot]


def test_a_refusal_charges_only_what_a_cascade_threw_away() -> None:
    fakes = _Fakes()
    settle, _ = fakes.settlement()
    settle.add_spent(9)
    exc = OpenAIError(502, "Tier `cloud`: down", code="upstream_down")
    got = asyncio.run(settle.refused(exc, tenant=TENANT, decision=None, features=None, cache="miss"))
    assert fakes.charged == [9] and fakes.accounted == [("refused", 502)]
    assert (got.status_code, json.loads(got.body)["error"]["code"], got.headers["x-request-id"]) == (
        502, "upstream_down", "r1")


def test_a_second_refusal_outside_strict_mode_answers_the_same_error_but_counts_it_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Settlement, "strict", False)
    fakes = _Fakes()
    settle, _ = fakes.settlement()
    exc = OpenAIError(503, "Tier `cloud`: down", code="upstream_down")
    first, again = (asyncio.run(settle.refused(exc, tenant=TENANT, decision=None, features=None, cache="miss"))
                    for _ in range(2))
    assert (first.status_code, first.body) == (again.status_code, again.body)
    assert fakes.accounted == [("refused", 503)] and fakes.charged == [0] and settle.settled == "refused"


@pytest.mark.parametrize(("sent", "stream", "charged", "prompt"), [
    (False, False, 0, 0),  # never reached a backend: costs nothing
    (True, True, 7, 7),  # a stream not begun: the prompt
    (True, False, 7 + 16, 7),  # a JSON answer: the prompt and the max_tokens the backend was asked for
], ids=["not-sent", "stream", "json"])
def test_a_client_gone_before_its_answer_is_charged_what_a_backend_may_have_done(sent, stream, charged,
                                                                                  prompt) -> None:
    fakes = _Fakes()
    settle, _ = fakes.settlement()
    outcome = Outcome(cache="miss", body=_body(sent))
    got = asyncio.run(settle.gone(tenant=TENANT, decision=None, features=FEATURES, outcome=outcome, stream=stream))
    assert got.status_code == 499 and fakes.charged == [charged] and fakes.accounted == [("gone", prompt)]


def test_each_ending_hands_accounting_one_finished_record_of_what_was_known() -> None:
    fakes = _Fakes()
    ctx, decision = _Ctx(), Decision(rule="long", tier="cloud")
    asyncio.run(fakes.settlement()[0].answered(ctx, Outcome(cache="miss"), "edge", 200, 0.001, 7, 4, elapsed=0.5))
    asyncio.run(fakes.settlement()[0].hit(ctx, Outcome(cache="hit-semantic"), None, 0.002))  # type: ignore[arg-type]
    exc = OpenAIError(503, "Tier `cloud`: down", code="upstream_down")
    asyncio.run(fakes.settlement()[0].refused(exc, tenant=TENANT, decision=decision, features=None, cache="miss"))
    outcome = Outcome(cache="bypass", body=_body(True))
    asyncio.run(fakes.settlement()[0].gone(tenant=None, decision=decision, features=FEATURES, outcome=outcome))
    answered, hit, refused, gone = fakes.finished
    assert (answered.arrival, answered.tier, answered.status, answered.cache) == (ctx.arrival, "edge", 200, "miss")
    assert (answered.overhead, answered.elapsed, answered.prompt_tokens, answered.completion_tokens) == (
        0.001, 0.5, 7, 4)
    assert (answered.tenant, answered.decision, answered.features) == (TENANT, ctx.decision, FEATURES)
    assert (hit.tier, hit.status, hit.cache, hit.elapsed, hit.completion_tokens) == ("cache", 200, "hit-semantic",
                                                                                     0.002, 0)
    assert (refused.tier, refused.status, refused.cache, refused.decision) == ("none", 503, "miss", decision)
    assert refused.overhead == refused.elapsed > 0  # all of it the gateway's: no backend answered
    assert (gone.tier, gone.status, gone.cache, gone.prompt_tokens, gone.tenant) == ("cloud", 499, "bypass", 7, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        gone.status = 200  # type: ignore[misc]


def test_a_shadow_check_stores_the_tiers_answer_or_counts_a_failure_and_charges_nothing() -> None:
    fakes = _Fakes()
    settle, metrics = fakes.settlement()
    asyncio.run(settle.shadow(_Ctx(), Outcome(), "tier answer"))  # type: ignore[arg-type]
    other, _ = fakes.settlement()
    asyncio.run(other.shadow(_Ctx(), Outcome(), None))  # type: ignore[arg-type]
    assert fakes.stored == ["tier answer"] and fakes.charged == [] and fakes.accounted == []
    assert metrics.shadow_checks.labels("checked")._value.get() == 1


def test_each_settlement_is_the_requests_last_span_named_for_how_it_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    spans: list[tuple[str, dict[str, object]]] = []

    @contextmanager
    def span(name: str, **attributes: object) -> Iterator[None]:
        spans.append((name, attributes))
        yield

    monkeypatch.setattr(tracing, "span", span)
    fakes = _Fakes()
    settle, _ = fakes.settlement()
    asyncio.run(settle.answered(_Ctx(), Outcome(cache="miss"), "edge", 200, 0.001, 7, 4))
    other, _ = fakes.settlement()
    exc = OpenAIError(502, "Tier `cloud`: down", code="upstream_down")
    asyncio.run(other.refused(exc, tenant=TENANT, decision=None, features=None, cache="miss"))
    assert spans == [("settle", {"tiergate.settled": "answered"}), ("settle", {"tiergate.settled": "refused"})]


def _body(sent: bool) -> UpstreamBody:
    body = UpstreamBody.of(_Ctx(), as_json=True)  # type: ignore[arg-type]
    if sent:
        body.amended({"logprobs": True}).mark_sent()  # an amended copy (a cascade's) counts for the request
    return body


# ---- the paths, through a gateway in process ---------------------------------------------------------------------


@dataclass
class Watch:
    """Every settlement (request id -> how it settled) and every token charge (tenant, tokens) of a run."""

    settled: list[tuple[str, str]] = field(default_factory=list)
    charged: list[int] = field(default_factory=list)

    def paths(self) -> Counter[str]:
        return Counter(p for _, p in self.settled)


@pytest.fixture
def watch(monkeypatch: pytest.MonkeyPatch) -> Watch:
    w = Watch()
    once, settle = Settlement._once, Limiter.settle

    def _once(self: Settlement, path: str) -> bool:
        w.settled.append((self.arrival.request_id, path))
        return once(self, path)

    async def _settle(self: Limiter, reservation: Reservation, used: int) -> None:
        w.charged.append(used)
        await settle(self, reservation, used)

    monkeypatch.setattr(Settlement, "_once", _once)
    monkeypatch.setattr(Limiter, "settle", _settle)
    return w


CHAT = {"model": "auto", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4, "temperature": 0}


def test_each_path_settles_once_with_its_charge(tmp_path: Path, watch: Watch) -> None:
    """JSON miss, stream miss, cache hit, a refusal and a backend failure: one settlement each, and the tenant is
    charged the answer's usage (the instant backend's prompt_tokens plus its completion tokens), nothing for a hit."""
    with aiohttp_server(make_app(4, model="edge-model")) as edge, \
            aiohttp_server(make_app(4, "error500", model="cloud-model")) as cloud:
        policy = write_policy(tmp_path / "p.yaml", [edge.url], [cloud.url], fallback=False)

        async def run() -> list[Any]:
            async with in_process(Settings(policy=policy, embedder=None, redis_url=None), KEYS) as c:
                json_miss = await c.post("/v1/chat/completions", json=CHAT, headers=AUTH)
                hit = await c.post("/v1/chat/completions", json=CHAT, headers=AUTH)
                stream = await c.post("/v1/chat/completions", headers=AUTH,
                                      json={**CHAT, "temperature": 1, "stream": True})
                bad = await c.post("/v1/chat/completions", json={**CHAT, "max_tokens": -1}, headers=AUTH)
                failed = await c.post("/v1/chat/completions", json={**CHAT, "model": "tiergate-cloud"},
                                      headers=AUTH)
                return [json_miss, hit, stream, bad, failed]

        json_miss, hit, stream, bad, failed = asyncio.run(run())
    assert json_miss.headers["x-tiergate-cache"] == "miss" and hit.headers["x-tiergate-cache"] == "hit-exact"
    assert stream.text.endswith("data: [DONE]\n\n") and bad.status_code == 400 and failed.status_code >= 500
    ids = [r.headers["x-request-id"] for r in (json_miss, hit, stream, bad, failed)]
    assert [rid for rid, _ in watch.settled] == ids  # one settlement per request, in order
    assert [p for _, p in watch.settled] == ["answered", "hit", "answered", "refused", "refused"]
    usage = json_miss.json()["usage"]
    assert watch.charged[0] == usage["prompt_tokens"] + usage["completion_tokens"]
    # The hit and the backend's failure give their reservations back (0); the 400 never reserved anything.
    assert len(watch.charged) == 4 and watch.charged[1] == watch.charged[3] == 0 and watch.charged[2] > 0


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_cascade_escalation_settles_once_and_charges_the_thrown_away_attempt(tmp_path: Path, watch: Watch,
                                                                              stream: bool) -> None:
    """The instant edge reports no log-probabilities, so no answer is sure enough: escalated to the cloud. The
    tenant pays the cloud's answer and the edge's thrown-away work, in the one settlement."""
    with aiohttp_server(make_app(4, model="edge-model")) as edge, \
            aiohttp_server(make_app(4, model="cloud-model")) as cloud:
        policy = write_cascade_policy(tmp_path / "p.yaml", edge.url, cloud.url)

        async def run() -> Any:
            async with in_process(Settings(policy=policy, embedder=None, redis_url=None), KEYS) as c:
                body = {**CHAT, "stream": stream, "stream_options": {"include_usage": True}} if stream else CHAT
                return await c.post("/v1/chat/completions", json=body, headers=AUTH)

        r = asyncio.run(run())
    assert r.headers["x-tiergate-cascade"] == "escalated" and r.headers["x-tiergate-tier"] == "cloud"
    assert watch.paths() == Counter({"answered": 1}) and len(watch.charged) == 1
    assert watch.charged[0] > 2 * 4  # both tiers' completions (4 tokens each) and the prompts


# ---- a client gone, a shadow check: in process too -----------------------------------------------------------------


async def _leaving(app: Any, body: dict[str, Any], *, leave_after_s: float | None = None) -> list[dict[str, Any]]:
    """One request straight through the ASGI app, from a client that hangs up: after `leave_after_s`, or (None) as
    soon as its answer's first bytes arrive. Returns what the app sent."""
    payload = json.dumps(body).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "query_string": b"",
             "root_path": "", "client": ("127.0.0.1", 50000), "server": ("gateway", 80),
             "headers": [(b"host", b"gateway"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(payload)).encode()),
                         (b"authorization", AUTH["Authorization"].encode())]}
    gone, sent, delivered = asyncio.Event(), [], False
    if leave_after_s is not None:
        asyncio.get_running_loop().call_later(leave_after_s, gone.set)

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": payload, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if leave_after_s is None and message["type"] == "http.response.body" and message.get("body"):
            gone.set()

    await app(scope, receive, send)
    return sent


def _settings(policy: Path) -> Settings:
    return Settings(policy=policy, embedder=None, redis_url=None, log_format="console", log_level="warning")


def test_a_client_gone_before_its_answer_began_settles_once_charged_what_the_backend_was_asked(
        tmp_path: Path, watch: Watch) -> None:
    """A backend that never answers; the client hangs up after the request reached it: one `gone` settlement each,
    a JSON request charged its prompt and max_tokens (4), a stream its prompt only."""
    from tiergate.gateway.app import create_app

    with aiohttp_server(make_app(4, "hang", model="edge-model")) as edge, \
            aiohttp_server(make_app(4, "hang", model="cloud-model")) as cloud:
        policy = write_policy(tmp_path / "p.yaml", [edge.url], [cloud.url], fallback=False)

        async def run() -> list[list[dict[str, Any]]]:
            app = create_app(_settings(policy), keyring=KEYS)
            async with app.router.lifespan_context(app):
                return [await _leaving(app, {**CHAT, "stream": stream}, leave_after_s=0.3)
                        for stream in (False, True)]

        json_gone, stream_gone = asyncio.run(run())
    for sent in (json_gone, stream_gone):
        assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 499
    assert watch.paths() == Counter({"gone": 2}) and len(watch.settled) == 2
    prompt = watch.charged[1]
    assert prompt > 0 and watch.charged == [prompt + 4, prompt]


def test_a_stream_whose_client_leaves_settles_once_charged_what_was_relayed(tmp_path: Path, watch: Watch) -> None:
    """A slow stream of 40 tokens whose client leaves after the first bytes: one `answered` settlement, charged the
    prompt and the tokens relayed (no usage chunk came), far from the whole answer."""
    from tiergate.gateway.app import create_app

    with aiohttp_server(make_app(40, "slow", model="edge-model")) as edge, \
            aiohttp_server(make_app(4, model="cloud-model")) as cloud:
        policy = write_policy(tmp_path / "p.yaml", [edge.url], [cloud.url], fallback=False)

        async def run() -> tuple[list[dict[str, Any]], int]:
            app = create_app(_settings(policy), keyring=KEYS)
            async with app.router.lifespan_context(app):
                sent = await _leaving(app, {**CHAT, "max_tokens": 40, "stream": True})
                async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
                    answered = await c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 1}, headers=AUTH)
                return sent, answered.json()["usage"]["prompt_tokens"]

        sent, _ = asyncio.run(run())
    assert sent[0]["status"] == 200
    assert [p for _, p in watch.settled] == ["answered", "answered"] and len(watch.charged) == 2
    relayed = watch.charged[0] - (watch.charged[1] - 1)  # the second request: the same prompt and 1 token
    assert 1 <= relayed < 40


def test_a_shadow_check_settles_once_on_its_own_and_charges_nothing(tmp_path: Path, watch: Watch,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A hit sampled for a shadow check (the cache's verdict forced to `verify`): the request settles as a hit,
    the check, once the tier answered, as a shadow check; the tenant pays only the first request's answer."""
    check = SemanticCache.check

    async def sampled(self: SemanticCache, *args: Any, **kw: Any) -> Any:
        result = await check(self, *args, **kw)
        return dataclasses.replace(result, reason="verify") if result.hit is not None else result

    monkeypatch.setattr(SemanticCache, "check", sampled)
    with aiohttp_server(make_app(4, model="edge-model")) as edge, \
            aiohttp_server(make_app(4, model="cloud-model")) as cloud:
        policy = write_policy(tmp_path / "p.yaml", [edge.url], [cloud.url], fallback=False)

        async def run() -> list[Any]:
            async with in_process(_settings(policy), KEYS) as c:
                miss = await c.post("/v1/chat/completions", json=CHAT, headers=AUTH)
                hit = await c.post("/v1/chat/completions", json=CHAT, headers=AUTH)
                await eventually(lambda: len(watch.settled) == 3, "the shadow check settled")
                return [miss, hit]

        miss, hit = asyncio.run(run())
    assert hit.headers["x-tiergate-cache"] == "hit-exact"
    ids = [miss.headers["x-request-id"], hit.headers["x-request-id"], hit.headers["x-request-id"]]
    assert watch.settled == list(zip(ids, ["answered", "hit", "shadow"], strict=True))
    usage = miss.json()["usage"]
    assert watch.charged == [usage["prompt_tokens"] + usage["completion_tokens"], 0]  # the hit: nothing


# ---- cost: priced once, on settling, under the request's own policy ----------------------------------------------

EDGE_PRICE, CLOUD_PRICE = TierPrice(prompt_per_1k=0.01, completion_per_1k=0.03), TierPrice(
    prompt_per_1k=0.6, cached_prompt_per_1k=0.15, completion_per_1k=2.4)
COSTS = CostsConfig(currency="USD", reference_tier="cloud", prices={"edge": EDGE_PRICE, "cloud": CLOUD_PRICE})


TIER_KINDS = {"edge": SimpleNamespace(kind="edge"), "cloud": SimpleNamespace(kind="cloud"),
              "cheap-cloud": SimpleNamespace(kind="cloud")}


def _priced_ctx(**kw: Any) -> _Ctx:
    return _Ctx(policy=SimpleNamespace(costs=COSTS, budgets=None, tiers=TIER_KINDS), **kw)


def _samples(metrics: GatewayMetrics) -> dict[tuple[str, ...], float]:
    """The spend series as {(name, tenant, tier, rule, kind?, currency): value}."""
    out = {}
    for metric in (metrics.spend, metrics.spend_reference):
        for fam in metric.collect():
            for s in fam.samples:
                if s.name.endswith("_total"):
                    out[(s.name, *s.labels.values())] = s.value
    return out


def test_an_answer_records_its_cost_and_reference_once_with_the_thrown_away_attempt() -> None:
    fakes = _Fakes()
    settle, metrics = fakes.settlement()
    ctx = _priced_ctx(decision=Decision(rule="cascade", tier="edge"))
    settle.add_spent(12, ctx=ctx, tier="edge", prompt_tokens=7)  # the edge's 7 prompt and 5 completion tokens
    quoted = settle.quote(ctx, "cloud", 7, 4, 2)  # type: ignore[arg-type]
    asyncio.run(settle.answered(ctx, Outcome(cache="miss"), "cloud", 200, 0.001, 7, 4, cached_tokens=2))
    answer = (5 * 0.6 + 2 * 0.15 + 4 * 2.4) / 1000
    thrown = (7 * 0.01 + 5 * 0.03) / 1000
    assert quoted == pytest.approx(answer + thrown)
    assert _samples(metrics) == pytest.approx({
        ("tiergate_spend_total", "alpha", "cloud", "cascade", "answer", "USD"): answer,
        ("tiergate_spend_total", "alpha", "edge", "cascade", "escalated", "USD"): thrown,
        ("tiergate_spend_reference_total", "alpha", "cloud", "cascade", "USD"): answer,
    })
    assert fakes.charged == [7 + 4 + 12]


def test_an_edge_answer_saves_the_difference_and_a_hit_the_whole_reference_price() -> None:
    fakes = _Fakes()
    settle, metrics = fakes.settlement()
    asyncio.run(settle.answered(_priced_ctx(), Outcome(cache="miss"), "edge", 200, 0.001, 1000, 1000))
    spent = _samples(metrics)
    assert spent[("tiergate_spend_total", "alpha", "edge", "default", "answer", "USD")] == pytest.approx(0.04)
    assert spent[("tiergate_spend_reference_total", "alpha", "edge", "default", "USD")] == pytest.approx(3.0)

    hit_settle, metrics = fakes.settlement()
    hit = CacheHit(CachedAnswer("chat", "hi", "stop", "m", "edge", prompt_tokens=99, completion_tokens=1000),
                   "hit-exact")
    asyncio.run(hit_settle.hit(_priced_ctx(), Outcome(cache="hit-exact"), hit, 0.001))
    assert _samples(metrics) == pytest.approx({  # prompt: this request's own count (FEATURES: 7)
        ("tiergate_spend_total", "alpha", "cache", "default", "answer", "USD"): 0.0,
        ("tiergate_spend_reference_total", "alpha", "cache", "default", "USD"): (7 * 0.6 + 1000 * 2.4) / 1000,
    })


def test_refused_gone_and_shadow_record_only_the_work_done_and_no_reference() -> None:
    fakes = _Fakes()
    ctx = _priced_ctx(decision=Decision(rule="cascade", tier="edge"))
    refused, metrics = fakes.settlement()
    refused.add_spent(10, ctx=ctx, tier="edge", prompt_tokens=10)  # type: ignore[arg-type]
    exc = OpenAIError(502, "Tier `cloud`: down", code="upstream_down")
    asyncio.run(refused.refused(exc, tenant=TENANT, decision=ctx.decision, features=None, cache="miss"))
    assert _samples(metrics) == pytest.approx({
        ("tiergate_spend_total", "alpha", "edge", "cascade", "escalated", "USD"): 10 * 0.01 / 1000})

    gone, metrics = fakes.settlement()
    asyncio.run(gone.gone(tenant=TENANT, decision=ctx.decision, features=FEATURES, ctx=ctx,  # type: ignore[arg-type]
                          outcome=Outcome(cache="miss", body=_body(True))))
    assert _samples(metrics) == pytest.approx({  # the prompt on the decided tier, not the max_tokens charged
        ("tiergate_spend_total", "alpha", "edge", "cascade", "gone", "USD"): 7 * 0.01 / 1000})
    never_sent, metrics = fakes.settlement()
    asyncio.run(never_sent.gone(tenant=TENANT, decision=ctx.decision, features=FEATURES, ctx=ctx,  # type: ignore[arg-type]
                                outcome=Outcome(cache="miss", body=_body(False))))
    assert _samples(metrics) == {}

    shadow, metrics = fakes.settlement()
    answer = CachedAnswer("chat", "hi", "stop", "m", "cloud", prompt_tokens=7, completion_tokens=3)
    asyncio.run(shadow.shadow(ctx, Outcome(), answer))  # type: ignore[arg-type]
    assert _samples(metrics) == pytest.approx({
        ("tiergate_spend_total", "alpha", "cloud", "cascade", "shadow", "USD"): (7 * 0.6 + 3 * 2.4) / 1000})


def test_a_policy_without_costs_records_no_spend_and_quotes_none() -> None:
    fakes = _Fakes()
    settle, metrics = fakes.settlement()
    assert settle.quote(_Ctx(), "edge", 7, 4) is None  # type: ignore[arg-type]
    asyncio.run(settle.answered(_Ctx(), Outcome(cache="miss"), "edge", 200, 0.001, 7, 4))
    assert _samples(metrics) == {}


def _priced_policy(path: Path, edge: str, cloud: str, *, cascade: bool = False) -> Path:
    if cascade:
        write_cascade_policy(path, edge, cloud)
    else:
        write_policy(path, [edge], [cloud], fallback=False)
    text = path.read_text()
    path.write_text(text.replace("rules:\n", """\
costs:
  currency: USD
  reference_tier: cloud
  prices:
    edge: {prompt_per_1k: 0.01, completion_per_1k: 0.03}
    cloud: {prompt_per_1k: 0.6, cached_prompt_per_1k: 0.15, completion_per_1k: 2.4}
rules:
""", 1))
    return path


def _spend_series(text: str) -> dict[tuple[str, ...], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in ("tiergate_spend_total", "tiergate_spend_reference_total"):
                out[(s.name, *(s.labels[k] for k in ("tier", "rule", "kind") if k in s.labels))] = s.value
    return out


def test_each_path_records_its_cost_once_and_json_answers_say_it(tmp_path: Path, watch: Watch) -> None:
    """Through a gateway in process: a JSON edge answer's x-tiergate-cost is prompt/1000 · price + completion/1000
    · price, and is what the spend counter got; its cache hit costs 0 and saves the reference tier's price; a
    stream is priced on settling (no header: its cost is known only at its end)."""
    with aiohttp_server(make_app(4, model="edge-model")) as edge, \
            aiohttp_server(make_app(4, model="cloud-model")) as cloud:
        policy = _priced_policy(tmp_path / "p.yaml", edge.url, cloud.url)

        async def run() -> tuple[list[Any], str]:
            async with in_process(Settings(policy=policy, embedder=None, redis_url=None), KEYS) as c:
                miss = await c.post("/v1/chat/completions", json=CHAT, headers=AUTH)
                hit = await c.post("/v1/chat/completions", json=CHAT, headers=AUTH)
                stream = await c.post("/v1/chat/completions", headers=AUTH,
                                      json={**CHAT, "temperature": 1, "stream": True})
                await eventually(lambda: len(watch.settled) == 3, "three settlements")
                return [miss, hit, stream], (await c.get("/metrics")).text

        (miss, hit, stream), metrics = asyncio.run(run())
    assert [p for _, p in watch.settled] == ["answered", "hit", "answered"]
    usage = miss.json()["usage"]
    edge_cost = usage["prompt_tokens"] / 1000 * 0.01 + usage["completion_tokens"] / 1000 * 0.03
    assert float(miss.headers["x-tiergate-cost"]) == pytest.approx(edge_cost, abs=1e-10)
    assert hit.headers["x-tiergate-cache"] == "hit-exact" and hit.headers["x-tiergate-cost"] == "0.0000000000"
    assert "x-tiergate-cost" not in stream.headers
    series = _spend_series(metrics)
    assert series[("tiergate_spend_total", "edge", "default", "answer")] == pytest.approx(2 * edge_cost)  # + stream
    assert series[("tiergate_spend_total", "cache", "default", "answer")] == 0
    assert series[("tiergate_spend_reference_total", "cache", "default")] > 0  # the hit's saving: all of it
    assert series[("tiergate_spend_reference_total", "edge", "default")] == pytest.approx(
        2 * (usage["prompt_tokens"] / 1000 * 0.6 + usage["completion_tokens"] / 1000 * 2.4))


def test_a_cascade_escalation_costs_both_tiers_in_its_header_and_counters(tmp_path: Path, watch: Watch) -> None:
    with aiohttp_server(make_app(4, model="edge-model")) as edge, \
            aiohttp_server(make_app(4, model="cloud-model")) as cloud:
        policy = _priced_policy(tmp_path / "p.yaml", edge.url, cloud.url, cascade=True)

        async def run() -> tuple[Any, str]:
            async with in_process(Settings(policy=policy, embedder=None, redis_url=None), KEYS) as c:
                r = await c.post("/v1/chat/completions", json=CHAT, headers=AUTH)
                await eventually(lambda: len(watch.settled) == 1, "one settlement")
                return r, (await c.get("/metrics")).text

        r, metrics = asyncio.run(run())
    assert r.headers["x-tiergate-cascade"] == "escalated"
    usage = r.json()["usage"]
    cloud_cost = usage["prompt_tokens"] / 1000 * 0.6 + usage["completion_tokens"] / 1000 * 2.4
    series = _spend_series(metrics)
    thrown = series[("tiergate_spend_total", "edge", "cascade", "escalated")]
    assert thrown > 0 and series[("tiergate_spend_total", "cloud", "cascade", "answer")] == pytest.approx(cloud_cost)
    assert float(r.headers["x-tiergate-cost"]) == pytest.approx(cloud_cost + thrown, abs=1e-10)
    assert series[("tiergate_spend_reference_total", "cloud", "cascade")] == pytest.approx(cloud_cost)


# ---- budgets: the reservation settles to what was recorded, on every path ------------------------------------------

BUDGETED = parse_policy("""\
version: 1
tiers:
  edge: {kind: edge, model: tiergate-edge}
  cloud: {kind: cloud, model: tiergate-cloud, endpoints: ["http://127.0.0.1:1"]}
costs:
  currency: USD
  reference_tier: cloud
  prices:
    edge: {prompt_per_1k: 0.01, completion_per_1k: 0.03}
    cloud: {prompt_per_1k: 0.6, cached_prompt_per_1k: 0.15, completion_per_1k: 2.4}
budgets:
  tenants:
    alpha: {period: day, hard: 10}
rules:
  - {name: default, tier: edge}
""")
CASCADE = Decision(rule="cascade", tier="edge", fallbacks=("cloud",), cascade=Cascade(escalate_to="cloud"))
DIGEST = hash_key("key-alpha-1")


def _budgeted(fakes: _Fakes) -> tuple[Settlement, Budgets, _Ctx]:
    """A settlement whose request reserved its worst case from alpha's budget of 10, as the pipeline does."""
    metrics = GatewayMetrics(CollectorRegistry())
    budgets = Budgets(metrics, LocalLedger())
    settle = Settlements(fakes, fakes, metrics, lambda: fakes, fakes, budgets).open(  # type: ignore[arg-type]
        Arrival.now("r1", "chat"))
    settle.key = DIGEST
    ctx = _Ctx(policy=BUDGETED, decision=CASCADE)
    assert asyncio.run(settle.reserve_budget(ctx, 16)) is ctx  # type: ignore[arg-type]
    return settle, budgets, ctx


def _left(budgets: Budgets) -> float:
    left = asyncio.run(budgets.usage(BUDGETED, "alpha", DIGEST)).budgets["tenant"]["remaining"]
    assert isinstance(left, float)
    return left


EDGE_16 = (7 * 0.01 + 16 * 0.03) / 1000  # the first attempt's worst case: 7 prompt, 16 completion tokens
CLOUD_16 = (7 * 0.6 + 16 * 2.4) / 1000
THROWN = (7 * 0.01 + 5 * 0.03) / 1000  # the edge's 7 prompt and 5 completion tokens, thrown away


def test_a_cascade_reserves_its_costlier_path_and_settles_to_what_it_used() -> None:
    fakes = _Fakes()
    settle, budgets, ctx = _budgeted(fakes)
    assert _left(budgets) == pytest.approx(10 - EDGE_16 - CLOUD_16)
    settle.add_spent(12, ctx=ctx, tier="edge", prompt_tokens=7)  # type: ignore[arg-type]
    quoted = settle.quote(ctx, "cloud", 7, 4)  # type: ignore[arg-type]
    asyncio.run(settle.answered(ctx, Outcome(cache="miss"), "cloud", 200, 0.001, 7, 4))  # type: ignore[arg-type]
    assert quoted == pytest.approx(THROWN + (7 * 0.6 + 4 * 2.4) / 1000)
    assert _left(budgets) == pytest.approx(10 - quoted, abs=1e-9)  # the figure the client was told
    mine = asyncio.run(budgets.usage(BUDGETED, "alpha", DIGEST))
    assert (mine.spend, mine.requests) == (pytest.approx(quoted), 1)


def test_a_refusal_a_hit_and_a_client_gone_settle_their_reservation_too() -> None:
    fakes = _Fakes()
    refused, budgets, ctx = _budgeted(fakes)
    refused.add_spent(12, ctx=ctx, tier="edge", prompt_tokens=7)  # type: ignore[arg-type]
    exc = OpenAIError(502, "Tier `cloud`: down", code="upstream_down")
    asyncio.run(refused.refused(exc, tenant=TENANT, decision=CASCADE, features=FEATURES, cache="miss"))
    assert _left(budgets) == pytest.approx(10 - THROWN, abs=1e-9)  # only the thrown-away attempt

    nothing, budgets, ctx = _budgeted(fakes)
    asyncio.run(nothing.refused(exc, tenant=TENANT, decision=CASCADE, features=FEATURES, cache="miss"))
    assert _left(budgets) == 10.0

    hit, budgets, ctx = _budgeted(fakes)
    answer = CacheHit(CachedAnswer("chat", "hi", "stop", "m", "edge", prompt_tokens=7, completion_tokens=3),
                      "hit-exact")
    asyncio.run(hit.hit(ctx, Outcome(cache="hit-exact"), answer, 0.001))  # type: ignore[arg-type]
    assert _left(budgets) == 10.0

    gone, budgets, ctx = _budgeted(fakes)
    asyncio.run(gone.gone(tenant=TENANT, decision=CASCADE, features=FEATURES, ctx=ctx,  # type: ignore[arg-type]
                          outcome=Outcome(cache="miss", body=_body(True))))
    assert _left(budgets) == pytest.approx(10 - 7 * 0.01 / 1000, abs=1e-9)  # its prompt, on the decided tier


def _by_source(metrics: GatewayMetrics) -> dict[str, float]:
    """The saving per source: tiergate_savings_reference_total less tiergate_savings_spend_total."""
    out: dict[str, float] = {}
    for metric, sign in ((metrics.savings_reference, 1), (metrics.savings_spend, -1)):
        for fam in metric.collect():
            for s in fam.samples:
                if s.name.endswith("_total"):
                    out[s.labels["source"]] = out.get(s.labels["source"], 0.0) + sign * s.value
    return out


def test_a_fallback_saves_as_the_tier_that_answered_and_a_client_gone_spends_without_saving() -> None:
    """A fallback's answer counts towards the tier that gave it, not the one decided; a client gone after its
    request reached a backend spends its prompt there with nothing saved (no answer, so no reference)."""
    fakes = _Fakes()
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)

    def settle() -> Any:
        s, _ = fakes.settlement()
        s._deps.metrics = metrics
        return s

    to_cloud = Decision(rule="default", tier="edge", fallbacks=("cloud",))
    asyncio.run(settle().answered(_priced_ctx(decision=to_cloud), Outcome(cache="miss"), "cloud", 200, 0.001,
                                  100, 100))
    to_edge = Decision(rule="big", tier="cloud", fallbacks=("edge",))
    asyncio.run(settle().answered(_priced_ctx(decision=to_edge), Outcome(cache="miss"), "edge", 200, 0.001,
                                  100, 100))
    edge_only = Decision(rule="default", tier="edge")
    asyncio.run(settle().gone(tenant=TENANT, decision=edge_only, features=FEATURES,
                              ctx=_priced_ctx(decision=edge_only),  # type: ignore[arg-type]
                              outcome=Outcome(cache="miss", body=_body(True))))
    asyncio.run(settle().gone(tenant=TENANT, decision=edge_only, features=FEATURES,
                              ctx=_priced_ctx(decision=edge_only),  # type: ignore[arg-type]
                              outcome=Outcome(cache="miss", body=_body(False))))  # never reached a backend

    cloud_100 = (100 * 0.6 + 100 * 2.4) / 1000
    edge_100 = (100 * 0.01 + 100 * 0.03) / 1000
    assert _by_source(metrics) == pytest.approx({
        "cloud": 0.0,  # the edge failed over to the reference tier: nothing saved, nothing lost
        "edge": (cloud_100 - edge_100) - 7 * 0.01 / 1000,  # the cloud's fallback on the edge; the gone prompt
    })
    assert _samples(metrics)[("tiergate_spend_total", "alpha", "edge", "default", "gone", "USD")] == \
        pytest.approx(7 * 0.01 / 1000)
    totals = {name: sum(v for k, v in _samples(metrics).items() if k[0] == name)
              for name in ("tiergate_spend_total", "tiergate_spend_reference_total")}
    assert sum(_by_source(metrics).values()) == pytest.approx(
        totals["tiergate_spend_reference_total"] - totals["tiergate_spend_total"])


def test_the_saving_is_split_by_what_saved_it_and_adds_up_to_reference_less_spend() -> None:
    fakes = _Fakes()
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    cascade = Decision(rule="cascade", tier="edge", cascade=Cascade(escalate_to="cloud"))

    def settle() -> Any:
        s, _ = fakes.settlement()
        s._deps.metrics = metrics  # every ending below counts into one registry
        return s

    edge = (1000 * 0.01 + 1000 * 0.03) / 1000
    asyncio.run(settle().answered(_priced_ctx(), Outcome(cache="miss"), "edge", 200, 0.001, 1000, 1000))
    hit = CacheHit(CachedAnswer("chat", "hi", "stop", "m", "edge", prompt_tokens=7, completion_tokens=100),
                   "hit-exact")
    asyncio.run(settle().hit(_priced_ctx(), Outcome(cache="hit-exact"), hit, 0.001))
    shadow = CachedAnswer("chat", "hi", "stop", "m", "cloud", prompt_tokens=7, completion_tokens=100)
    asyncio.run(settle().shadow(_priced_ctx(), Outcome(), shadow))  # type: ignore[arg-type]
    kept = settle()
    asyncio.run(kept.answered(_priced_ctx(decision=cascade), Outcome(cache="miss"), "edge", 200, 0.001, 100, 100))
    escalated = settle()
    escalated.add_spent(200, ctx=_priced_ctx(decision=cascade), tier="edge", prompt_tokens=100)  # type: ignore[arg-type]
    asyncio.run(escalated.answered(_priced_ctx(decision=cascade), Outcome(cache="miss"), "cloud", 200, 0.001,
                                   100, 100))
    asyncio.run(settle().answered(_priced_ctx(decision=Decision(rule="default", tier="cloud")),
                                  Outcome(cache="miss"), "cloud", 200, 0.001, 500, 50))

    reference = (7 * 0.6 + 100 * 2.4) / 1000
    cloud_100 = (100 * 0.6 + 100 * 2.4) / 1000
    edge_100 = (100 * 0.01 + 100 * 0.03) / 1000
    assert _by_source(metrics) == pytest.approx({
        "edge": (1000 * 0.6 + 1000 * 2.4) / 1000 - edge,
        "cache": reference - reference,  # the hit saved the cloud's price; its shadow check spent it again
        "cascade": (cloud_100 - edge_100) + (cloud_100 - cloud_100) - edge_100,  # kept; escalated; thrown away
        "cloud": 0.0,  # the reference tier itself saves nothing
    })
    totals = {name: sum(v for k, v in _samples(metrics).items() if k[0] == name)
              for name in ("tiergate_spend_total", "tiergate_spend_reference_total")}
    assert sum(_by_source(metrics).values()) == pytest.approx(
        totals["tiergate_spend_reference_total"] - totals["tiergate_spend_total"])
