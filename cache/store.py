"""Where entries live, and the in-process store used when no Redis is configured.

A store owns the entries and answers nearest-neighbour searches over them, one namespace at a time. The
in-process store and the Redis 7 ("stream") layout keep a `VectorIndex` in this process (the Redis 7 one kept
in step by following a change stream every gateway shares); the Redis 8 ("vectorset") layout searches inside
Redis (`VSIM`) and keeps nothing here. When `max_entries` is exceeded, all of them drop expired entries first,
then the soonest-expiring entry of the tenant holding the most (`cache.shares`: one tenant's flood evicts its
own answers, not its peers').

Tested in `tests/cache/test_semantic.py`.
"""

from __future__ import annotations

import heapq
import time
from typing import Protocol

import numpy as np

from tiergate.cache.index import VectorIndex
from tiergate.cache.keys import tenant_tag
from tiergate.cache.shares import TenantShares
from tiergate.cache.types import CacheEntry

__all__ = ["MemoryStore", "Store", "StoreUnavailable"]


class StoreUnavailable(Exception):
    """The store cannot answer right now (Redis down or slow): the caller bypasses the cache."""


class Store(Protocol):
    index: VectorIndex  # this process's index (empty for a store that searches server-side)
    in_process: bool  # True when reads never wait on I/O (the lookup then needs no timeout)

    @property
    def kind(self) -> str:
        """Which store serves: "memory", "redis-stream" (Redis 7 path) or "redis-vectorset" (Redis 8)."""
        ...

    def describe(self) -> dict[str, object]:
        """What /readyz shows about the store: its kind, whether it is up, why it is not the expected one."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def available(self) -> bool:
        """False while the store is known to be down (requests bypass without trying)."""
        ...

    async def get_many(self, namespace: str, entry_ids: list[str]) -> list[CacheEntry | None]:
        """The entries (of one namespace) with these ids; None for one that is gone, expired or unreadable."""
        ...

    async def nearest(self, namespace: str, vector: np.ndarray, k: int,
                      min_sim: float) -> list[tuple[CacheEntry, float]]:
        """Up to k live entries of the namespace nearest to `vector` whose approximate cosine is at least
        `min_sim`, with that cosine, best first (the caller re-scores exactly with the entry's own vector)."""
        ...

    async def put(self, entry: CacheEntry, vector: np.ndarray | None) -> int:
        """Store (replace) an entry; returns how many entries were evicted to make room."""
        ...

    async def delete(self, entry_id: str, namespace: str | None = None) -> int: ...

    async def delete_tenant(self, tenant: str) -> int: ...

    async def delete_all(self) -> int: ...


class MemoryStore:
    """Entries in a dict; for a single gateway process (the embedded default)."""

    in_process = True
    kind = "memory"

    def __init__(self, index: VectorIndex, *, max_entries: int) -> None:
        self.index = index
        self._max = max_entries
        self._entries: dict[str, CacheEntry] = {}
        self._order: list[tuple[float, str]] = []  # (expires_at, id), stale items skipped lazily
        self._shares = TenantShares()

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def available(self) -> bool:
        return True

    def describe(self) -> dict[str, object]:
        return {"store": self.kind, "up": True, "entries": len(self._entries)}

    def __len__(self) -> int:
        return len(self._entries)

    async def nearest(self, namespace: str, vector: np.ndarray, k: int,
                      min_sim: float) -> list[tuple[CacheEntry, float]]:
        found = [(eid, s) for eid, s in self.index.search(namespace, vector, k) if s >= min_sim]
        entries = await self.get_many(namespace, [eid for eid, _ in found])
        return [(e, s) for (_, s), e in zip(found, entries, strict=True) if e is not None]

    async def get_many(self, namespace: str, entry_ids: list[str]) -> list[CacheEntry | None]:
        now = time.time()
        out: list[CacheEntry | None] = []
        for eid in entry_ids:
            e = self._entries.get(eid)
            if e is not None and e.expires_at <= now:
                self._drop(eid)
                e = None
            out.append(e)
        return out

    async def put(self, entry: CacheEntry, vector: np.ndarray | None) -> int:
        self._entries[entry.id] = entry
        heapq.heappush(self._order, (entry.expires_at, entry.id))
        self._shares.add(entry.id, entry.expires_at)
        if vector is not None:
            self.index.upsert(entry.id, entry.namespace, entry.id.split("-", 1)[0], vector, entry.expires_at)
        else:
            self.index.remove(entry.id)
        evicted, now = 0, time.time()
        while len(self._entries) > self._max and self._order and self._order[0][0] <= now:  # expired first
            exp, eid = heapq.heappop(self._order)
            e = self._entries.get(eid)
            if e is not None and e.expires_at == exp:
                self._drop(eid)
                evicted += 1
        while len(self._entries) > self._max:
            victim = self._shares.victim()
            if victim is None:
                break
            self._drop(victim)
            evicted += 1
        if len(self._order) > 4 * max(len(self._entries), 1024):  # drop stale heap items now and then
            self._order = [(e.expires_at, i) for i, e in self._entries.items()]
            heapq.heapify(self._order)
        return evicted

    async def delete(self, entry_id: str, namespace: str | None = None) -> int:
        return 1 if self._drop(entry_id) else 0

    async def delete_tenant(self, tenant: str) -> int:
        prefix = tenant_tag(tenant) + "-"
        doomed = [eid for eid in self._entries if eid.startswith(prefix)]
        for eid in doomed:
            self._drop(eid)
        return len(doomed)

    async def delete_all(self) -> int:
        n = len(self._entries)
        self._entries.clear()
        self._order.clear()
        self._shares.clear()
        self.index.clear()
        return n

    def _drop(self, entry_id: str) -> bool:
        self.index.remove(entry_id)
        self._shares.remove(entry_id)
        return self._entries.pop(entry_id, None) is not None
