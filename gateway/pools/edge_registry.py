"""Which edge nodes an edge tier has: static endpoints from its config and nodes that registered by heartbeat.

Heartbeats (`edge-node serve --gateway ...` posts its load every ~2 s) register or refresh a node. With a Redis
client they are stored in Redis (a sorted set of last-seen times plus a hash of node info), so every gateway
replica sees every node whichever replica received the heartbeat; without one the registry lives in this process.
A node silent for `ttl_s` is dropped, and the requests still waiting for its answer to begin are told
(`Endpoint.declare_lost`).

Each registration has an owner (`gateway.edge_auth`): `NODE_KEY_OWNER` when the node proved its id with its own
key, else the digest of the claim it registered with. While a registration lives (until it deregisters or goes
silent past the TTL), a heartbeat or deregistration from another owner is refused (`NodeOwned`), checked atomically
in Redis (so on every replica) and in this replica's view (which also holds while Redis is away or lost its data);
only a node's own key (`authoritative`) takes an id over. Tested in `tests/gateway/pools/test_edge.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any

import msgspec
import structlog

from tiergate.core.edge_identity import NODE_ID_PATTERN
from tiergate.core.pool import Endpoint, context_mismatch
from tiergate.core.wire import decode_json
from tiergate.gateway.pools.edge_urls import UrlError, base_url

if TYPE_CHECKING:
    from redis.commands.core import AsyncScript

    from tiergate.cache.redis.conn import AnyRedis

__all__ = ["NODE_KEY_OWNER", "EdgeRegistry", "HeartbeatError", "NodeInfo", "NodeOwned", "check_context", "last_seen",
           "parse_heartbeat"]

log = structlog.get_logger("edge_node.pool")

# The registry in Redis: KEYS[1] a sorted set of node ids by last heartbeat, KEYS[2] a hash of their
# NodeInfo, KEYS[3] a sorted set of nodes that deregistered (tombstones, by time, kept one TTL), KEYS[4] a hash of
# each registration's owner. A replica forgets a node when it deregistered (anywhere) or went silent past the TTL,
# not merely because Redis no longer lists it: after a restart without persistence Redis lists only the nodes that
# have sent a heartbeat since. Each change is one script (atomic on one server and on a Cluster, where the keys
# share a hash tag; redis-py's async cluster client has no usable MULTI), so two heartbeats for one id through two
# replicas cannot both take it.
_CLEANUP_LUA = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
for _, id in ipairs(ids) do
  redis.call('HDEL', KEYS[2], id)
  redis.call('HDEL', KEYS[4], id)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ARGV[1])
return #ids
"""
# ARGV: id, now, info, owner, authoritative ('1'), live after (now - ttl). 0: another owner holds a live id.
_HEARTBEAT_LUA = """
if ARGV[5] ~= '1' then
  local held = redis.call('HGET', KEYS[4], ARGV[1])
  local seen = redis.call('ZSCORE', KEYS[1], ARGV[1])
  if held and held ~= ARGV[4] and seen and tonumber(seen) > tonumber(ARGV[6]) then return 0 end
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('HSET', KEYS[4], ARGV[1], ARGV[4])
redis.call('ZREM', KEYS[3], ARGV[1])
return 1
"""
# ARGV: id, now, owner, authoritative ('1'), live after. -1: another owner holds a live id; else 1 if it was known.
_DEREGISTER_LUA = """
if ARGV[4] ~= '1' then
  local held = redis.call('HGET', KEYS[4], ARGV[1])
  local seen = redis.call('ZSCORE', KEYS[1], ARGV[1])
  if held and held ~= ARGV[3] and seen and tonumber(seen) > tonumber(ARGV[5]) then return -1 end
end
local n = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
return n
"""

NODE_KEY_OWNER = "node-key"  # a registration's owner when the node proved its id with its own key


class HeartbeatError(ValueError):
    """A heartbeat body that does not describe a node (the gateway answers 400 with this message, naming `param`)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class NodeOwned(Exception):
    """The node id is registered by someone else (another key or claim): the gateway answers 409."""


_MAX_SLOTS = 65_536
_MAX_QUEUE = 1_000_000
_MAX_CTX = 16_777_216
_MAX_TOKENS_PER_S = 1e7


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
    # Generated tokens per second over the node's last few seconds: a live tier's price per token (policies.costs).
    tokens_per_s: Annotated[float, msgspec.Meta(ge=0, le=_MAX_TOKENS_PER_S)] = 0.0
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
        raise HeartbeatError(f"invalid heartbeat: {e}", _field_of(e)) from None
    if not NODE_ID_PATTERN.fullmatch(info.node_id):
        raise HeartbeatError("invalid heartbeat: node_id must be 1-128 letters, digits and `._:-`, starting with a "
                             "letter or digit", "node_id")
    try:
        info.url = base_url(info.url)
    except UrlError as e:
        raise HeartbeatError(f"invalid heartbeat: {e}", "url") from None
    return info


def _field_of(e: Exception) -> str | None:
    """The field a msgspec error names (`... - at `$.slots``, ``missing required field `url```), if any."""
    found = re.search(r"at `\$\.([A-Za-z_]+)|missing required field `([A-Za-z_]+)`", str(e))
    return (found.group(1) or found.group(2)) if found else None


def _base_url(url: str) -> str:
    url = url.rstrip("/")
    return url.removesuffix("/v1")


class EdgeRegistry:
    """The edge nodes of one tier, by id: `static` ones from the config and `nodes` registered by heartbeat."""

    def __init__(
        self,
        tier: str,
        static_endpoints: Sequence[str],
        model: str,
        redis: AnyRedis | None,
        ttl_s: float,
        *,
        max_context: int | None,
        key_prefix: str,
        clock: Callable[[], float] = time.time,
        static_headers: Mapping[str, str] | None = None,
        node_headers: Callable[[str, str], Mapping[str, str]] | None = None,
    ) -> None:
        self.tier = tier
        self.ttl_s = ttl_s
        self.max_context = max_context  # what the tier's policy promises; a node serving less is warned about
        self._clock = clock  # wall clock: heartbeat times are shared between replicas through Redis
        self._redis = redis
        # One hash tag for both keys: their MULTI and script stay in one slot on a Redis Cluster.
        self._k_seen = f"{{{key_prefix}:{tier}}}:seen"
        self._k_info = f"{{{key_prefix}:{tier}}}:info"
        self._k_gone = f"{{{key_prefix}:{tier}}}:gone"
        self._k_owner = f"{{{key_prefix}:{tier}}}:owner"
        self.nodes: dict[str, Endpoint] = {}  # registered through heartbeats
        self.owners: dict[str, str] = {}  # node id -> the owner of its registration (this replica's view)
        # what every request to a node carries (its API key): per node, else the tier's key for every endpoint
        self._node_headers = node_headers or (lambda _nid, _owner: {})
        self.static: dict[str, Endpoint] = {}
        for url in static_endpoints:
            base = _base_url(url)
            self.static[base] = Endpoint(id=base, base_url=base, model=model, tier=tier, slots=1,
                                         extra={"source": "static", "up": True, "draining": False},
                                         headers=dict(static_headers or {}))
        self._scripts: dict[str, AsyncScript] = {}
        self._redis_warned = False
        self.refreshes = 0  # refreshes from Redis completed (tests wait on it rather than on the clock)

    def all(self) -> Iterator[Endpoint]:
        yield from self.static.values()
        yield from self.nodes.values()

    async def heartbeat(self, info: bytes | Mapping[str, Any] | NodeInfo, *, owner: str = "",
                        authoritative: bool = False) -> Endpoint:
        """Register or refresh a node for `owner`. Raises HeartbeatError on a malformed heartbeat, NodeOwned when
        another owner holds the id (unless `authoritative`: the node proved the id with its own key)."""
        node = parse_heartbeat(info)
        now = self._clock()
        if not authoritative:
            self._check_owner(node.node_id, owner, now)
        if self._redis is not None:
            try:
                taken = await self._script(_HEARTBEAT_LUA, node.node_id, now, msgspec.json.encode(node), owner,
                                           "1" if authoritative else "0", now - self.ttl_s)
            except Exception as e:  # noqa: BLE001 - Redis down: this replica still knows the node
                self._redis_failed(e)
            else:
                if not taken:
                    raise NodeOwned(_owned(node.node_id, self.ttl_s))
        return self._apply(node, now, owner)

    async def deregister(self, node_id: str, *, owner: str = "", authoritative: bool = False) -> bool:
        """Forget a node now (it is draining). True if it was known; NodeOwned when another owner holds it."""
        now = self._clock()
        if not authoritative:
            self._check_owner(node_id, owner, now)
        known = False
        if self._redis is not None:
            try:
                n = await self._script(_DEREGISTER_LUA, node_id, now, owner, "1" if authoritative else "0",
                                       now - self.ttl_s)
            except Exception as e:  # noqa: BLE001 - Redis down: forgotten here, expires there
                self._redis_failed(e)
            else:
                if n == -1:
                    raise NodeOwned(_owned(node_id, self.ttl_s))
                known = bool(n)
        self.owners.pop(node_id, None)
        known = self.nodes.pop(node_id, None) is not None or known
        if known:
            log.info("edge node deregistered", tier=self.tier, node_id=node_id)
        return known

    def _check_owner(self, node_id: str, owner: str, now: float) -> None:
        """This replica's view: a live registration of `node_id` held by another owner refuses `owner`."""
        held = self.owners.get(node_id)
        ep = self.nodes.get(node_id)
        if held is not None and held != owner and ep is not None and now - last_seen(ep) <= self.ttl_s:
            raise NodeOwned(_owned(node_id, self.ttl_s))

    async def refresh(self) -> None:
        """Expire silent nodes and (with Redis) load every node any replica has heard from."""
        now = self._clock()
        if self._redis is None:
            for nid, ep in list(self.nodes.items()):
                if now - last_seen(ep) > self.ttl_s:
                    del self.nodes[nid]
                    self.owners.pop(nid, None)
                    log.info("edge node expired", tier=self.tier, node_id=nid)
                    ep.declare_lost(f"no heartbeat for {self.ttl_s:g}s")
            return
        try:
            await self._script(_CLEANUP_LUA, now - self.ttl_s)
            async with self._redis.pipeline(transaction=False) as pipe:  # writes are atomic scripts
                pipe.zrange(self._k_seen, 0, -1, withscores=True)
                pipe.hgetall(self._k_info)
                pipe.zrange(self._k_gone, 0, -1)
                pipe.hgetall(self._k_owner)
                seen_rows, infos, gone_rows, owner_rows = await pipe.execute()
        except Exception as e:  # noqa: BLE001 - keep the last snapshot while Redis is away
            self._redis_failed(e)
            return
        self._redis_warned = False
        self.refreshes += 1
        seen = {_s(k): float(v) for k, v in seen_rows}
        owners = {_s(k): _s(v) for k, v in owner_rows.items()}
        live: set[str] = set()
        for k, raw in infos.items():
            nid = _s(k)
            if nid not in seen:
                continue
            try:
                node = msgspec.json.decode(raw, type=NodeInfo)
            except (msgspec.ValidationError, msgspec.DecodeError):
                continue
            self._apply(node, seen[nid], owners.get(nid, self.owners.get(nid, "")))
            live.add(nid)
        gone = {_s(k) for k in gone_rows}
        for nid, ep in list(self.nodes.items()):
            # Not listed but heard from within the TTL: Redis lost it (a restart); its next heartbeat refills it.
            if nid in gone or nid not in live and now - last_seen(ep) > self.ttl_s:
                del self.nodes[nid]
                self.owners.pop(nid, None)
                if nid not in gone:  # a node that deregistered is draining: it finishes what it holds
                    ep.declare_lost(f"no heartbeat for {self.ttl_s:g}s")

    async def keep_fresh(self, interval_s: float) -> None:
        """`refresh` every `interval_s` until cancelled."""
        while True:
            with contextlib.suppress(Exception):
                await self.refresh()
            await asyncio.sleep(interval_s)

    def _apply(self, node: NodeInfo, seen: float, owner: str) -> Endpoint:
        ep = self.nodes.get(node.node_id)
        load = (node.busy + node.queued) / max(node.slots, 1)
        if ep is None:
            ep = Endpoint(id=node.node_id, base_url=_base_url(node.url), model=node.model, tier=self.tier,
                          slots=node.slots, reported_load=load, headers=dict(self._node_headers(node.node_id, owner)))
            self.nodes[node.node_id] = ep
            self.owners[node.node_id] = owner
            log.info("edge node registered", tier=self.tier, node_id=node.node_id, url=node.url,
                     model=node.model, slots=node.slots)
        elif seen < last_seen(ep):
            return ep  # an older reading (another replica's snapshot) must not overwrite a newer one
        else:
            if ep.base_url != _base_url(node.url) or self.owners.get(node.node_id) != owner:
                log.info("edge node re-registered", tier=self.tier, node_id=node.node_id, url=node.url,
                         was=ep.base_url, same_owner=self.owners.get(node.node_id) == owner)
            ep.base_url = _base_url(node.url)
            ep.model = node.model
            ep.slots = node.slots
            ep.reported_load = load
            if self.owners.get(node.node_id) != owner:
                self.owners[node.node_id] = owner
                ep.headers = dict(self._node_headers(node.node_id, owner))
        check_context(ep, self.max_context, node.ctx)
        ep.extra.update(source="heartbeat", seen=seen, busy=node.busy, queued=node.queued, ctx=node.ctx,
                        tokens_per_s=node.tokens_per_s)
        return ep

    async def _script(self, source: str, *args: float | str | bytes) -> Any:  # what the Lua script returns
        script = self._scripts.get(source)
        if script is None:
            assert self._redis is not None, "the registry's scripts run only with Redis"
            script = self._scripts[source] = self._redis.register_script(source)
        return await script(keys=[self._k_seen, self._k_info, self._k_gone, self._k_owner], args=list(args))

    def _redis_failed(self, e: Exception) -> None:
        if not self._redis_warned:
            log.warning("edge registry: redis unavailable, using this replica's view", tier=self.tier,
                        error=f"{type(e).__name__}: {e}")
            self._redis_warned = True


def _owned(node_id: str, ttl_s: float) -> str:
    return (f"edge node id `{node_id}` is registered by another node (other credentials or claim): a node id is "
            f"refreshed, replaced or removed only by the node that holds it. Give this node its own --node-id, or, "
            f"if it restarted without deregistering, wait until its old registration expires ({ttl_s:g}s)")


def check_context(ep: Endpoint, max_context: int | None, ctx: object) -> None:
    """Warn (once per value) when a node's context per request is smaller than its tier's `max_context`."""
    if warning := context_mismatch(ep, max_context, ctx):
        log.warning("tier_context_larger_than_server", tier=ep.tier, endpoint=ep.id, message=warning,
                    max_context=max_context, server_context=ctx)


def last_seen(ep: Endpoint) -> float:
    """When the node was last heard from (0: never)."""
    seen = ep.extra.get("seen", 0.0)
    return float(seen) if isinstance(seen, (int, float)) else 0.0


def _s(v: bytes | bytearray | str | float) -> str:
    return v.decode() if isinstance(v, (bytes, bytearray)) else str(v)
