"""Which entry a full store gives up: the soonest-expiring one of the tenant holding the most entries.

The size bound is shared by every tenant, so evicting the globally oldest entry would let one tenant's flood of
small answers push out everyone else's. Evicting from the largest holder instead means that a tenant's puts
evict its own entries once it holds the most, and a tenant holding fewer entries than another never loses one
to that peer. With one tenant it is the plain soonest-expiring bound. The Redis layouts do the same inside their
put scripts (`cache.redis.fair`); this is the in-process store's copy.

Tested in `tests/cache/test_shares.py`.
"""

from __future__ import annotations

import heapq

__all__ = ["TenantShares", "tag_of"]


def tag_of(entry_id: str) -> str:
    """The tenant tag an entry id starts with ("<tenant tag>-<hash>", `cache.keys`)."""
    return entry_id.split("-", 1)[0]


class TenantShares:
    """Entries per tenant, each tenant's in expiry order, for choosing eviction victims."""

    def __init__(self) -> None:
        self._live: dict[str, dict[str, float]] = {}  # tag -> entry id -> expiry
        self._order: dict[str, list[tuple[float, str]]] = {}  # tag -> heap of (expiry, id); stale items skipped

    def __len__(self) -> int:
        return sum(len(ids) for ids in self._live.values())

    def held(self, tag: str) -> int:
        return len(self._live.get(tag, ()))

    def add(self, entry_id: str, expires_at: float) -> None:
        tag = tag_of(entry_id)
        self._live.setdefault(tag, {})[entry_id] = expires_at
        heap = self._order.setdefault(tag, [])
        heapq.heappush(heap, (expires_at, entry_id))
        if len(heap) > 4 * max(len(self._live[tag]), 256):  # re-stored entries leave stale items: compact
            self._order[tag] = [(e, i) for i, e in self._live[tag].items()]
            heapq.heapify(self._order[tag])

    def remove(self, entry_id: str) -> None:
        tag = tag_of(entry_id)
        ids = self._live.get(tag)
        if ids is not None and ids.pop(entry_id, None) is not None and not ids:
            del self._live[tag], self._order[tag]

    def victim(self) -> str | None:
        """The soonest-expiring entry of the tenant holding the most (ties: any of them); None when empty.
        It stays recorded until `remove` is called for it."""
        if not self._live:
            return None
        tag = max(self._live, key=lambda t: len(self._live[t]))
        ids, heap = self._live[tag], self._order[tag]
        while heap:
            exp, eid = heap[0]
            if ids.get(eid) == exp:
                return eid
            heapq.heappop(heap)
        raise AssertionError(f"tenant {tag} holds entries its order lost")  # add() always pushes what it records

    def clear(self) -> None:
        self._live.clear()
        self._order.clear()
