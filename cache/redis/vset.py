"""The Redis 8 layout ("redis-vectorset"): entries and their vectors in Redis, searched by Redis.

Keys (prefix `P`, default "tiergate:cache"; `<ns>` is the namespace hash of `cache.keys`):
- `P:vs:{<ns>}:v`: a vector set per namespace; element = entry id, int8-quantised (Q8), HNSW M 16. It carries
  no attributes: nothing on it changes on the request path.
- `P:vs:{<ns>}:e:<id>`: a hash per entry (`cache.redis.codec`, float16 vector for the exact re-score) with
  an EXPIREAT: an expired answer can never be read, whatever the vector set still holds.
- `P:vs:z`: one sorted set `<ns>:<id>` -> expiry, over all namespaces: the size bound (`max_entries`) and the
  sweep of expired vectors. `P:vs:t:<tenant tag>` and `P:vs:tc` hold each tenant's share of it
  (`cache.redis.fair`): a full store evicts the soonest-expiring entry of the tenant holding the most.

The hash tag `{<ns>}` keeps a namespace's keys in one slot. The scripts touch the global sorted set and build
evicted entries' keys themselves, which a single server (with or without replicas) allows; a Redis Cluster
uses the stream layout (docs/cache.md says what a Cluster needs for this one).

- lookup: exact `HGETALL`; then semantic in one round trip: a script runs `VSIM ... WITHSCORES COUNT k EF ef`
  and returns the hashes of the candidates at or above the floor with their scores. Inside a script VSIM runs
  on Redis's main thread, which saves the thread Redis otherwise starts per query and the second round trip
  (measured in docs/benchmarks.md); the price is that the search (about a millisecond at 1M entries) holds the
  main thread. `vset_search_in_script=False` keeps VSIM threaded (two round trips) for a Redis that many
  replicas search at once. A candidate whose hash is gone (expired, evicted) is skipped and its vector removed
  in the background (`VREM`, only if the hash is still absent).
- put: the hash, expiry and bound first (one script), then `VADD ... CAS` (the neighbour search runs in a Redis
  thread). A lookup between the two finds no vector yet: a miss, never an answer without its hash.
- sweep: every `sweep_every_s`, any gateway removes up to 500 expired vectors per call (idempotent: gateways
  sweeping together only repeat each other's work).

Nothing is loaded at start and no process holds an index: a gateway that starts against a Redis holding 1M
entries serves semantic hits from its first request.

Bad input never fails a request and never makes a wrong hit: a vector set whose dimension is not the
embedder's (a new embedder) or a key of the wrong type answers no candidates and is logged once per
namespace (`cache_vector_set_unusable`); such a namespace stays exact-only until its old entries expire or
are invalidated (its vector set disappears with its last element).

Tested in `tests/integration/test_cache_redis.py`.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

import numpy as np
import structlog
from redis.exceptions import ResponseError

from tiergate.cache.redis.codec import decode_entry, entry_fields, glob_escape
from tiergate.cache.redis.fair import FAIR_LUA, counts_key, tenant_key
from tiergate.cache.redis.layout import FAILURES, Conn
from tiergate.cache.types import CacheEntry

__all__ = ["VectorSetLayout", "entry_key", "vset_key", "zset_key"]

log = structlog.get_logger("tiergate.cache.redis")

_SWEEP_LIMIT = 500
_SCAN_BATCH = 1000

# Drop one entry from its vector set and its hash, given its member `<ns>:<id>` of the sorted set; `base`
# (the key prefix without its last colon) holds the tenants' shares of the bound (`cache.redis.fair`).
_DROP = FAIR_LUA + """
local function base_of(prefix) return string.sub(prefix, 1, -2) end
local function drop(prefix, member)
  local ns, id = string.match(member, '^([^:]+):(.+)$')
  if ns == nil then return end
  redis.call('VREM', prefix .. '{' .. ns .. '}:v', id)
  redis.call('DEL', prefix .. '{' .. ns .. '}:e:' .. id)
end
"""

_PUT = _DROP + """
-- KEYS: 1 entry hash, 2 sorted set.  ARGV: 1 member, 2 expiry (s), 3 max entries, 4 key prefix, 5.. fields
redis.call('HSET', KEYS[1], unpack(ARGV, 5))
redis.call('PEXPIREAT', KEYS[1], math.floor(tonumber(ARGV[2]) * 1000))
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
local base = base_of(ARGV[4])
tenant_add(base, ARGV[1], ARGV[2])
local t = redis.call('TIME')
for _, m in ipairs(take_expired(base, KEYS[2], t[1], 100)) do drop(ARGV[4], m) end
local evicted, itself = 0, 0
local excess = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[3])
if excess > 0 then
  for _, m in ipairs(fair_pop(base, KEYS[2], excess)) do
    drop(ARGV[4], m)
    evicted = evicted + 1
    if m == ARGV[1] then itself = 1 end
  end
end
return {evicted, itself}
"""

_SWEEP = _DROP + """
-- KEYS: 1 sorted set.  ARGV: 1 key prefix, 2 limit
local t = redis.call('TIME')
local expired = take_expired(base_of(ARGV[1]), KEYS[1], t[1], tonumber(ARGV[2]))
for _, m in ipairs(expired) do drop(ARGV[1], m) end
return #expired
"""

# A candidate whose hash was gone: remove its vector unless the entry was stored again meanwhile.
_FORGET = FAIR_LUA + """
-- KEYS: 1 vector set, 2 entry hash, 3 sorted set.  ARGV: 1 id, 2 member, 3 base of the tenants' shares
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('VREM', KEYS[1], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[2])
  tenant_remove(ARGV[3], ARGV[2])
  return 1
end
return 0
"""

# VSIM and the candidates' hashes in one round trip (scores are VSIM's (1 + cosine) / 2).
_SEARCH = """#!lua flags=no-writes
-- (read-only: served while writes are paused, e.g. during a FAILOVER)
-- KEYS: 1 vector set.  ARGV: 1 FP32 blob, 2 count, 3 ef, 4 lowest score kept, 5 entry key prefix
local found = redis.call('VSIM', KEYS[1], 'FP32', ARGV[1], 'WITHSCORES', 'COUNT', ARGV[2], 'EF', ARGV[3])
local floor, out = tonumber(ARGV[4]), {}
for i = 1, #found, 2 do
  if tonumber(found[i + 1]) < floor then break end
  out[#out + 1] = found[i]
  out[#out + 1] = found[i + 1]
  local row = redis.pcall('HGETALL', ARGV[5] .. found[i])
  if row.err then row = row.err end  -- e.g. WRONGTYPE: returned as text, read as an unreadable entry
  out[#out + 1] = row
end
return out
"""

_DELETE = _DROP + """
-- KEYS: 1 entry hash, 2 sorted set.  ARGV: 1 key prefix, 2 member
local n = redis.call('EXISTS', KEYS[1])
drop(ARGV[1], ARGV[2])
redis.call('ZREM', KEYS[2], ARGV[2])
tenant_remove(base_of(ARGV[1]), ARGV[2])
return n
"""


def vset_key(prefix: str, ns: str) -> str:
    return f"{prefix}:vs:{{{ns}}}:v"


def entry_key(prefix: str, ns: str, entry_id: str) -> str:
    return f"{prefix}:vs:{{{ns}}}:e:{entry_id}"


def zset_key(prefix: str) -> str:
    return f"{prefix}:vs:z"


class VectorSetLayout:
    kind = "redis-vectorset"

    def __init__(self, conn: Conn) -> None:
        self._c = conn
        s = conn.settings
        self._prefix = s.prefix
        self._p = f"{s.prefix}:vs:"
        self._base = f"{s.prefix}:vs"  # the tenants' shares of the bound: `<base>:t:<tag>`, `<base>:tc`
        self._zset = zset_key(s.prefix)
        self._dim = conn.index.dim
        self._put_script = conn.r.register_script(_PUT)
        self._forget_script = conn.bg.register_script(_FORGET)
        self._sweep_script = conn.bg.register_script(_SWEEP)
        self._delete_script = conn.bg.register_script(_DELETE)
        self._search_script = conn.r.register_script(_SEARCH)
        self._in_script = s.vset_search_in_script
        self._vadd_opts: list[Any] = ["CAS", "Q8", "EF", s.vset_build_ef, "M", s.vset_m]
        self._search_ef = s.vset_search_ef
        self._entries: int | None = None
        self._unusable: OrderedDict[str, None] = OrderedDict()  # namespaces already logged (bounded)
        self._tasks: set[asyncio.Task[Any]] = set()

    def entries(self) -> int | None:
        return self._entries

    # -- keys --------------------------------------------------------------------------------------------
    def _vset(self, ns: str) -> str:
        return vset_key(self._prefix, ns)

    def _hash(self, ns: str, entry_id: str) -> str:
        return entry_key(self._prefix, ns, entry_id)

    # -- request path -----------------------------------------------------------------------------------
    async def get_many(self, namespace: str, entry_ids: list[str]) -> list[CacheEntry | None]:
        rows = await self._read(namespace, entry_ids)
        return [decode_entry(eid, row, self._c.metrics, self._dim) for eid, row in zip(entry_ids, rows, strict=True)]

    async def nearest(self, namespace: str, vector: np.ndarray, k: int,
                      min_sim: float) -> list[tuple[CacheEntry, float]]:
        blob = np.asarray(vector, "<f4").tobytes()
        try:
            if self._in_script:
                rows = await self._search(namespace, blob, k, min_sim)
            else:
                rows = await self._search_threaded(namespace, blob, k, min_sim)
        except ResponseError as exc:
            if not _unusable(exc):
                raise
            self._unusable_namespace(namespace, exc)  # another dimension (a new embedder), a key of another type
            return []
        out, gone = [], []
        for eid, s, row in rows:
            e = decode_entry(eid, row, self._c.metrics, self._dim)
            if e is None:
                gone.append(eid)
            else:
                out.append((e, s))
        if gone:
            self._spawn(self._forget(namespace, gone))
        return out

    # VSIM's score is (1 + cosine) / 2 of the int8 vectors: approximate, re-scored exactly by the caller.
    async def _search(self, ns: str, blob: bytes, k: int, min_sim: float) -> list[tuple[str, float, Any]]:
        flat = await self._search_script(keys=[self._vset(ns)], args=[blob, k, self._search_ef,
                                                                       repr((1.0 + min_sim) / 2.0), self._hash(ns, "")])
        return [(flat[i].decode(), 2.0 * float(flat[i + 1]) - 1.0, _row(flat[i + 2])) for i in range(0, len(flat), 3)]

    async def _search_threaded(self, ns: str, blob: bytes, k: int, min_sim: float) -> list[tuple[str, float, Any]]:
        found = await self._c.r.execute_command("VSIM", self._vset(ns), "FP32", blob, "WITHSCORES", "COUNT", k,
                                                "EF", self._search_ef)
        cands = [(eid.decode(), 2.0 * float(score) - 1.0) for eid, score in _pairs(found)]
        cands = [(eid, s) for eid, s in cands if s >= min_sim]
        rows = await self._read(ns, [eid for eid, _ in cands]) if cands else []
        return [(eid, s, row) for (eid, s), row in zip(cands, rows, strict=True)]

    async def _read(self, ns: str, entry_ids: list[str]) -> list[Any]:
        """The entries' hashes in one pipelined round trip (an exception in place of an unreadable one)."""
        async with self._c.r.pipeline(transaction=False) as pipe:
            for eid in entry_ids:
                pipe.hgetall(self._hash(ns, eid))
            return await pipe.execute(raise_on_error=False)

    async def put(self, entry: CacheEntry, vector: np.ndarray | None) -> int:
        ns, eid = entry.namespace, entry.id
        args = [f"{ns}:{eid}", repr(entry.expires_at), self._c.settings.max_entries, self._p,
                *entry_fields(entry, vector, half=True)]
        evicted, itself = await self._put_script(keys=[self._hash(ns, eid), self._zset], args=args)
        if vector is not None and not itself:
            blob = np.asarray(vector, "<f4").tobytes()
            try:
                await self._c.r.execute_command("VADD", self._vset(ns), "FP32", blob, eid, *self._vadd_opts)
            except ResponseError as exc:
                if not _unusable(exc):
                    raise
                self._unusable_namespace(ns, exc)  # the set holds another dimension: this entry stays exact-only
        return int(evicted)

    def _unusable_namespace(self, ns: str, exc: Exception) -> None:
        self._c.metrics.errors.labels("vector_set").inc()
        if ns in self._unusable:
            return
        self._unusable[ns] = None
        if len(self._unusable) > 1024:
            self._unusable.popitem(last=False)
        log.error("cache_vector_set_unusable", namespace=ns, key=self._vset(ns), error=str(exc)[:200],
                  embedder_dim=self._dim, effect="semantic lookups in this namespace find nothing (exact hits "
                  "still work) until its old entries expire or are invalidated")

    async def _forget(self, ns: str, ids: list[str]) -> None:
        try:
            async with self._c.bg.pipeline(transaction=False) as pipe:
                for eid in ids:
                    await self._forget_script(keys=[self._vset(ns), self._hash(ns, eid), self._zset],
                                              args=[eid, f"{ns}:{eid}", self._base],
                                              client=pipe)  # type: ignore[arg-type]  # a pipeline queues the EVALSHA; redis-py names clients only
                await pipe.execute()
        except FAILURES:
            pass  # the sweep removes them later

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- admin -------------------------------------------------------------------------------------------
    async def delete(self, entry_id: str, namespace: str | None) -> int:
        members = [f"{namespace}:{entry_id}"] if namespace else \
            [m async for m in self._members(f"*:{glob_escape(entry_id)}")]
        n = 0
        for member in members:
            ns = member.split(":", 1)[0]
            n += int(await self._delete_script(keys=[self._hash(ns, entry_id), self._zset], args=[self._p, member]))
        return n

    async def delete_tenant(self, tag: str) -> int:
        return await self._delete_members(f"*:{glob_escape(tag)}-*")

    async def delete_all(self) -> int:
        n = await self._delete_members("*")
        await self._c.bg.delete(counts_key(self._base))  # shares left behind by entries stored before them
        async for key in self._c.bg.scan_iter(match=tenant_key(glob_escape(self._base), "*"), count=_SCAN_BATCH):
            await self._c.bg.unlink(key)
        # Anything left (vectors of entries whose sorted-set member was already gone): by key pattern.
        doomed: list[bytes] = []
        async for key in self._c.bg.scan_iter(match=f"{glob_escape(self._p)}{{*}}:*", count=_SCAN_BATCH):
            doomed.append(key)
        for i in range(0, len(doomed), _SCAN_BATCH):
            async with self._c.bg.pipeline(transaction=False) as pipe:
                for key in doomed[i:i + _SCAN_BATCH]:
                    pipe.unlink(key)
                await pipe.execute()
        return n

    async def has_data(self) -> bool:
        return bool(await self._c.bg.exists(self._zset))

    async def _members(self, pattern: str) -> Any:
        async for member, _score in self._c.bg.zscan_iter(self._zset, match=pattern, count=_SCAN_BATCH):
            yield member.decode()

    async def _delete_members(self, pattern: str) -> int:
        """Delete the entries whose sorted-set member matches; counts the entries whose hash was still there."""
        members = [m async for m in self._members(pattern)]
        n = 0
        for i in range(0, len(members), _SCAN_BATCH):
            async with self._c.bg.pipeline(transaction=False) as pipe:
                for member in members[i:i + _SCAN_BATCH]:
                    ns, _, eid = member.partition(":")
                    await self._delete_script(keys=[self._hash(ns, eid), self._zset], args=[self._p, member],
                                              # a pipeline queues the EVALSHA; redis-py annotates clients only
                                              client=pipe)  # type: ignore[arg-type]
                n += sum(int(x) for x in await pipe.execute())
        return n

    # -- background --------------------------------------------------------------------------------------
    async def prepare(self) -> None:
        return None

    async def on_connect(self, restarted: bool) -> None:
        self._entries = int(await self._c.bg.zcard(self._zset))
        self._c.metrics.entries.set(self._entries)

    async def run(self) -> None:
        """Sweep expired vectors every `sweep_every_s` while Redis is up; count the entries meanwhile."""
        bg = self._c.bg
        while self._c.up and not self._c.stopping:
            while await self._sweep_script(keys=[self._zset], args=[self._p, _SWEEP_LIMIT]) >= _SWEEP_LIMIT:
                pass
            self._entries = int(await bg.zcard(self._zset))
            self._c.metrics.entries.set(self._entries)
            await self._c.pause(self._c.settings.sweep_every_s)


def _unusable(exc: ResponseError) -> bool:
    """A vector set this gateway cannot use (not a failing server): another dimension, or not a vector set."""
    text = str(exc).lower()
    return "dimension" in text or "wrongtype" in text


def _row(flat: Any) -> dict[bytes, bytes] | ResponseError:
    """HGETALL's flat reply inside a script, as the dict redis-py makes of it outside one (its error as the
    exception a pipeline would have returned)."""
    if isinstance(flat, bytes):
        return ResponseError(flat.decode(errors="replace"))
    items = list(flat or [])
    return dict(zip(items[::2], items[1::2], strict=False))


def _pairs(found: Any) -> list[tuple[bytes, float]]:
    """VSIM WITHSCORES as (element, score) pairs, best first: redis-py parses it into a dict, a raw reply is a
    flat list."""
    if isinstance(found, dict):
        return [(k if isinstance(k, bytes) else str(k).encode(), float(v)) for k, v in found.items()]
    items = list(found or [])
    return [(items[i], float(items[i + 1])) for i in range(0, len(items) - 1, 2)]
