"""The gateway's view of an edge tier: which edge nodes exist, how loaded they are, which to try first.

Nodes come from two places: heartbeats (`edge-node serve --gateway ...` posts its load every ~2 s) and
static endpoints in the tier config (polled on `/health`). With a Redis client, heartbeats are stored in
Redis (a sorted set of last-seen times plus a hash of node info), so every gateway replica sees every
node whichever replica received the heartbeat; without one the registry lives in this process.
A node silent for `ttl_s` is dropped. Every replica also polls every node's `/health` itself (static ones for
their load; registered ones only for being alive): a node that stops answering (hung, SIGSTOPped, its host gone)
takes no new requests (a static one after one failed poll, a registered one after `lost_after`), and after
`lost_after` failed polls in a row the requests still waiting for its answer to begin are told
(`Endpoint.declare_lost`) and retried elsewhere by dispatch. `candidates()` runs on every request, so it only
reads the in-memory snapshot: least loaded first, where load = max(our in-flight / slots, reported
(busy+queued) / slots), round-robin among equals.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any

import aiohttp
import msgspec
import structlog

from tiergate.core.pool import Endpoint, context_mismatch
from tiergate.core.wire import decode_json
from tiergate.gateway.pools.breaker import CircuitBreaker

if TYPE_CHECKING:
    from redis.commands.core import AsyncScript

    from tiergate.cache.redis.conn import AnyRedis
    from tiergate.core.types import Features
    from tiergate.core.wire import ParsedRequest

__all__ = ["EdgePool", "HeartbeatError", "NodeInfo", "parse_heartbeat"]

log = structlog.get_logger("edge_node.pool")

# The registry in Redis: KEYS[1] a sorted set of node ids by last heartbeat, KEYS[2] a hash of their
# NodeInfo, KEYS[3] a sorted set of nodes that deregistered (tombstones, by time, kept one TTL). A replica
# forgets a node when it deregistered (anywhere) or went silent past the TTL, not merely because Redis no
# longer lists it: after a restart without persistence Redis lists only the nodes that have sent a
# heartbeat since. Each change is one script (atomic on one server and on a Cluster, where the keys share
# a hash tag; redis-py's async cluster client has no usable MULTI).
_CLEANUP_LUA = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
for _, id in ipairs(ids) do redis.call('HDEL', KEYS[2], id) end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ARGV[1])
return #ids
"""
_HEARTBEAT_LUA = """
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('ZREM', KEYS[3], ARGV[1])
"""
_DEREGISTER_LUA = """
local n = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
return n
"""


class HeartbeatError(ValueError):
    """A heartbeat body that does not describe a node (the gateway answers 400 with this message)."""


_MAX_SLOTS = 65_536
_MAX_QUEUE = 1_000_000
_MAX_CTX = 16_777_216


class NodeInfo(msgspec.Struct, forbid_unknown_fields=False):
    """What an edge node says about itself in each heartbeat."""

    node_id: str
    url: str
    model: str
    # Bounded so that a bad or hostile node cannot push absurd numbers into the load arithmetic.
    slots: Annotated[int, msgspec.Meta(ge=1, le=_MAX_SLOTS)] = 1
    busy: Annotated[int, msgspec.Meta(ge=0, le=_MAX_QUEUE)] = 0
    queued: Annotated[int, msgspec.Meta(ge=0, le=_MAX_QUEUE)] = 0
    ctx: Annotated[int, msgspec.Meta(ge=0, le=_MAX_CTX)] = 0
    tier: str | None = None


_node_info = msgspec.json.Decoder(NodeInfo)


def parse_heartbeat(body: bytes | Mapping[str, Any] | NodeInfo) -> NodeInfo:
    """Validate a heartbeat (raw JSON bytes, a decoded dict, or a NodeInfo).

    A NodeInfo built in code is converted again from its fields, so that the struct's own bounds are checked
    whatever the source: they live in one place, the struct."""
    try:
        if isinstance(body, (bytes, bytearray, memoryview)):
            info = decode_json(_node_info, body)
        else:
            fields = msgspec.structs.asdict(body) if isinstance(body, NodeInfo) else dict(body)
            info = msgspec.convert(fields, NodeInfo)
    except (msgspec.ValidationError, msgspec.DecodeError, TypeError) as e:
        raise HeartbeatError(f"invalid heartbeat: {e}") from None
    if not info.node_id or not info.url.startswith(("http://", "https://")):
        raise HeartbeatError("invalid heartbeat: node_id must be set and url must be an http(s) base URL")
    return info


def _base_url(url: str) -> str:
    url = url.rstrip("/")
    return url.removesuffix("/v1")


class EdgePool:
    """Registry + selection for one edge tier; implements core.pool.Pool."""

    def __init__(
        self,
        tier: str,
        static_endpoints: Sequence[str] = (),
        model: str = "",
        redis: AnyRedis | None = None,
        ttl_s: float = 10.0,
        *,
        poll_interval_s: float = 2.0,
        refresh_interval_s: float = 1.0,
        failure_threshold: int = 3,
        cooldown_s: float = 5.0,
        lost_after: int = 2,
        max_context: int | None = None,
        key_prefix: str = "tiergate:edge",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.tier: str = tier
        self.model = model
        self.ttl_s = ttl_s
        self._clock = clock  # wall clock: heartbeat times are shared between replicas through Redis
        self._redis = redis
        self._poll_interval = poll_interval_s
        self._refresh_interval = refresh_interval_s
        self._failure_threshold = failure_threshold
        self._cooldown_s = cooldown_s
        self._lost_after = max(1, lost_after)
        self.max_context = max_context  # what the tier's policy promises; a node serving less is warned about
        # One hash tag for both keys: their MULTI and script stay in one slot on a Redis Cluster.
        self._k_seen = f"{{{key_prefix}:{tier}}}:seen"
        self._k_info = f"{{{key_prefix}:{tier}}}:info"
        self._k_gone = f"{{{key_prefix}:{tier}}}:gone"
        self._nodes: dict[str, Endpoint] = {}  # registered through heartbeats
        self._static: dict[str, Endpoint] = {}
        for url in static_endpoints:
            base = _base_url(url)
            self._static[base] = Endpoint(id=base, base_url=base, model=model, tier=tier, slots=1,
                                          extra={"source": "static", "up": True, "draining": False})
        self._breakers: dict[str, CircuitBreaker] = {}
        self._rr = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        self._scripts: dict[str, AsyncScript] = {}
        self._redis_warned = False
        self.refreshes = 0  # refreshes from Redis completed (tests wait on it rather than on the clock)

    # ------------------------------------------------------------------ Pool protocol

    def candidates(self, request: ParsedRequest | None = None, features: Features | None = None) -> list[Endpoint]:
        """Usable endpoints, least loaded first; equal loads rotate so traffic spreads."""
        now = self._clock()
        usable = [e for e in self._all() if self._usable(e, now)]
        if not usable:
            return []
        usable.sort(key=lambda e: e.id)
        n, rr = len(usable), self._rr
        self._rr += 1
        order = {e.id: (i - rr) % n for i, e in enumerate(usable)}
        usable.sort(key=lambda e: (e.load(), order[e.id]))
        return usable

    def report(self, endpoint: Endpoint, ok: bool) -> None:
        """Consecutive failures put an endpoint on a growing cool-down (its circuit breaker, opened for
        `cooldown_s` doubling per further failure, at most 60 s); one success clears it."""
        if ok:
            self._breakers.pop(endpoint.id, None)
            return
        breaker = self._breakers.get(endpoint.id)
        if breaker is None:
            breaker = self._breakers[endpoint.id] = CircuitBreaker(
                self._failure_threshold, self._cooldown_s, backoff=2.0, max_open_s=60.0, late_failures_reopen=True)
        opened = breaker.opened_count
        breaker.record(False)
        if breaker.opened_count != opened:
            log.warning("edge endpoint cooling down", tier=self.tier, endpoint=endpoint.id,
                        failures=breaker.consecutive_failures, seconds=breaker.open_for_s)

    def healthy(self) -> bool:
        now = self._clock()
        return any(self._usable(e, now) for e in self._all())

    def endpoints(self) -> list[Endpoint]:
        return list(self._all())

    async def start(self) -> None:
        if self._tasks:
            return
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=min(2.0, self._poll_interval)))
        self._tasks.append(asyncio.create_task(self._poll_loop(), name=f"edge-pool-poll-{self.tier}"))
        self._tasks.append(asyncio.create_task(self._refresh_loop(), name=f"edge-pool-refresh-{self.tier}"))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ------------------------------------------------------------------ registration

    async def heartbeat(self, info: bytes | Mapping[str, Any] | NodeInfo) -> Endpoint:
        """Register or refresh a node. Raises HeartbeatError on a malformed heartbeat."""
        node = parse_heartbeat(info)
        now = self._clock()
        ep = self._apply(node, now)
        if self._redis is not None:
            try:
                await self._script(_HEARTBEAT_LUA, node.node_id, now, msgspec.json.encode(node))
            except Exception as e:  # noqa: BLE001 - Redis down: this replica still knows the node
                self._redis_failed(e)
        return ep

    async def deregister(self, node_id: str) -> bool:
        """Forget a node now (it is draining). True if it was known."""
        known = self._nodes.pop(node_id, None) is not None
        self._breakers.pop(node_id, None)
        if self._redis is not None:
            try:
                known = bool(await self._script(_DEREGISTER_LUA, node_id, self._clock())) or known
            except Exception as e:  # noqa: BLE001 - Redis down: forgotten here, expires there
                self._redis_failed(e)
        if known:
            log.info("edge node deregistered", tier=self.tier, node_id=node_id)
        return known

    async def refresh(self) -> None:
        """Expire silent nodes and (with Redis) load every node any replica has heard from."""
        now = self._clock()
        if self._redis is None:
            for nid, ep in list(self._nodes.items()):
                if now - _seen(ep) > self.ttl_s:
                    del self._nodes[nid]
                    log.info("edge node expired", tier=self.tier, node_id=nid)
                    ep.declare_lost(f"no heartbeat for {self.ttl_s:g}s")
            return
        try:
            await self._script(_CLEANUP_LUA, now - self.ttl_s)
            async with self._redis.pipeline(transaction=False) as pipe:  # writes are atomic scripts
                pipe.zrange(self._k_seen, 0, -1, withscores=True)
                pipe.hgetall(self._k_info)
                pipe.zrange(self._k_gone, 0, -1)
                seen_rows, infos, gone_rows = await pipe.execute()
        except Exception as e:  # noqa: BLE001 - keep the last snapshot while Redis is away
            self._redis_failed(e)
            return
        self._redis_warned = False
        self.refreshes += 1
        seen = {_s(k): float(v) for k, v in seen_rows}
        live: set[str] = set()
        for k, raw in infos.items():
            nid = _s(k)
            if nid not in seen:
                continue
            try:
                node = msgspec.json.decode(raw, type=NodeInfo)
            except (msgspec.ValidationError, msgspec.DecodeError):
                continue
            self._apply(node, seen[nid])
            live.add(nid)
        gone = {_s(k) for k in gone_rows}
        for nid, ep in list(self._nodes.items()):
            # Not listed but heard from within the TTL: Redis lost it (a restart); its next heartbeat refills it.
            if nid in gone or nid not in live and now - _seen(ep) > self.ttl_s:
                del self._nodes[nid]
                if nid not in gone:  # a node that deregistered is draining: it finishes what it holds
                    ep.declare_lost(f"no heartbeat for {self.ttl_s:g}s")

    # ------------------------------------------------------------------ internals

    def _all(self) -> Iterator[Endpoint]:
        yield from self._static.values()
        yield from self._nodes.values()

    def _usable(self, e: Endpoint, now: float) -> bool:
        x = e.extra
        if x.get("draining"):
            return False
        if x.get("source") == "static":
            if not x.get("up", True):
                return False
        elif now - _seen(e) > self.ttl_s or not x.get("alive", True):
            return False
        breaker = self._breakers.get(e.id)  # only asked: once cooled down, all traffic flows again (no trial)
        return breaker is None or breaker.available()

    def _apply(self, node: NodeInfo, seen: float) -> Endpoint:
        ep = self._nodes.get(node.node_id)
        load = (node.busy + node.queued) / max(node.slots, 1)
        if ep is None:
            ep = Endpoint(id=node.node_id, base_url=_base_url(node.url), model=node.model, tier=self.tier,
                          slots=node.slots, reported_load=load)
            self._nodes[node.node_id] = ep
            log.info("edge node registered", tier=self.tier, node_id=node.node_id, url=node.url,
                     model=node.model, slots=node.slots)
        elif seen < _seen(ep):
            return ep  # an older reading (another replica's snapshot) must not overwrite a newer one
        else:
            ep.base_url = _base_url(node.url)
            ep.model = node.model
            ep.slots = node.slots
            ep.reported_load = load
        _check_context(ep, self.max_context, node.ctx)
        ep.extra.update(source="heartbeat", seen=seen, busy=node.busy, queued=node.queued, ctx=node.ctx)
        return ep

    async def _script(self, source: str, *args: float | str | bytes) -> Any:  # what the Lua script returns
        script = self._scripts.get(source)
        if script is None:
            assert self._redis is not None, "the registry's scripts run only with Redis"
            script = self._scripts[source] = self._redis.register_script(source)
        return await script(keys=[self._k_seen, self._k_info, self._k_gone], args=list(args))

    def _redis_failed(self, e: Exception) -> None:
        if not self._redis_warned:
            log.warning("edge registry: redis unavailable, using this replica's view", tier=self.tier,
                        error=f"{type(e).__name__}: {e}")
            self._redis_warned = True

    async def _refresh_loop(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                await self.refresh()
            await asyncio.sleep(self._refresh_interval)

    async def _poll_loop(self) -> None:
        session = self._session
        assert session is not None, "started by `start`, after the session"
        while True:
            await asyncio.gather(*(self._poll(session, ep) for ep in list(self._static.values())),
                                 *(self._probe(session, ep) for ep in list(self._nodes.values())),
                                 return_exceptions=True)
            await asyncio.sleep(self._poll_interval * random.uniform(0.9, 1.1))

    async def _probe(self, session: aiohttp.ClientSession, ep: Endpoint) -> None:
        """Is a registered node alive? Any answer from /health says so (its load comes with its heartbeats)."""
        try:
            async with session.get(f"{ep.base_url}/health") as r:
                await r.read()
        except Exception as e:  # noqa: BLE001 - any failure to reach the node counts against it
            self._poll_failed(ep, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
            return
        if not ep.extra.get("alive", True):
            log.info("edge node answers its health checks again", tier=self.tier, node_id=ep.id)
        ep.extra.update(alive=True, poll_failures=0)

    def _poll_failed(self, ep: Endpoint, why: str) -> None:
        """A failed poll: no new requests for a static endpoint at once, for a registered node (which also sends
        heartbeats) after `lost_after` in a row, when the requests waiting on it go elsewhere too."""
        x = ep.extra
        n = x["poll_failures"] = int(x.get("poll_failures", 0)) + 1  # type: ignore[call-overload]
        if x.get("source") == "static":
            x["up"] = False
        elif n >= self._lost_after:  # a registered node also heartbeats: one slow /health is not enough
            x["alive"] = False
        if n == 1:
            log.warning("edge endpoint unreachable", tier=self.tier, endpoint=ep.id, url=ep.base_url, reason=why)
        if n >= self._lost_after:
            if n == self._lost_after and ep.waiting:
                log.warning("edge endpoint lost: requests waiting on it go elsewhere", tier=self.tier,
                            endpoint=ep.id, waiting=len(ep.waiting), failed_polls=n)
            ep.declare_lost(f"{n} health checks failed: {why}")

    async def _poll(self, session: aiohttp.ClientSession, ep: Endpoint) -> None:
        """Learn a static node's model, slots and load from /health (or /v1/models for other servers)."""
        x = ep.extra
        try:
            async with session.get(f"{ep.base_url}/health") as r:
                if r.status in (200, 503):
                    body = await r.json(content_type=None)
                    if isinstance(body, dict) and "slots" in body:
                        slots = max(int(body.get("slots") or 1), 1)
                        ep.slots = slots
                        ep.model = str(body.get("model") or ep.model)
                        ep.reported_load = (int(body.get("busy", 0)) + int(body.get("queued", 0))) / slots
                        _check_context(ep, self.max_context, body.get("ctx"))
                        x.update(up=True, draining=body.get("status") == "draining" or r.status == 503,
                                 busy=body.get("busy"), queued=body.get("queued"), ctx=body.get("ctx"),
                                 poll_failures=0)
                        return
            async with session.get(f"{ep.base_url}/v1/models") as r:
                if r.status == 200:
                    data = (await r.json(content_type=None)).get("data") or []
                    if data:
                        ep.model = str(data[0].get("id") or ep.model)
                    x.update(up=True, draining=False, poll_failures=0)
                    return
            x.update(up=False, poll_failures=0)  # it answers, but not as a server we can use: not hung
        except Exception as e:  # noqa: BLE001 - any failure to reach the node means it is down
            self._poll_failed(ep, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)


def _check_context(ep: Endpoint, max_context: int | None, ctx: object) -> None:
    """Warn (once per value) when a node's context per request is smaller than its tier's `max_context`."""
    if warning := context_mismatch(ep, max_context, ctx):
        log.warning("tier_context_larger_than_server", tier=ep.tier, endpoint=ep.id, message=warning,
                    max_context=max_context, server_context=ctx)


def _seen(ep: Endpoint) -> float:
    """When the node was last heard from (0: never)."""
    seen = ep.extra.get("seen", 0.0)
    return float(seen) if isinstance(seen, (int, float)) else 0.0


def _s(v: bytes | bytearray | str | float) -> str:
    return v.decode() if isinstance(v, (bytes, bytearray)) else str(v)
