"""The stream layout's key space: which shards there are, which one holds an entry, which keys are ours.

On one server there is one shard, its prefix the cache's (default "tiergate:cache"). On a Redis Cluster there
are `cluster_shards` of them, `{prefix:k}`: the hash tag keeps each shard's keys in one slot, and an entry's
shard is a hash of its id. Every gateway on a Cluster must split the cache the same way (`check_agreement`).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import structlog

from tiergate.cache.redis.codec import glob_escape
from tiergate.cache.redis.layout import Conn, Misconfigured

__all__ = ["Shard", "Shards"]

log = structlog.get_logger("tiergate.cache.redis")


@dataclass(frozen=True, slots=True)
class Shard:
    prefix: str
    zset: str
    stream: str

    @classmethod
    def named(cls, prefix: str) -> Shard:
        return cls(prefix, f"{prefix}:z", f"{prefix}:ev")

    def key(self, entry_id: str) -> str:
        return f"{self.prefix}:e:{entry_id}"


class Shards:
    """The shards of one prefix, in order (an entry's shard is found by its position)."""

    def __init__(self, prefix: str, cluster: bool, count: int) -> None:
        if cluster:
            self._all = [Shard.named(f"{{{prefix}:{k}}}") for k in range(count)]
            # The braces are literal in a SCAN pattern. The pattern also matches other prefixes that start
            # with ours (`{tiergate:cache:eu:3}`), so every key found is checked against our shards (`owned`).
            self.entry_glob = f"{{{glob_escape(prefix)}:*}}:e:"
        else:
            self._all = [Shard.named(prefix)]
            self.entry_glob = f"{glob_escape(prefix)}:e:"
        self._by_prefix = {shard.prefix: shard for shard in self._all}
        self._mismatch_logged = False

    def __len__(self) -> int:
        return len(self._all)

    def __iter__(self) -> Iterator[Shard]:
        return iter(self._all)

    def __getitem__(self, i: int) -> Shard:
        return self._all[i]

    def index_of(self, entry_id: str) -> int:
        return 0 if len(self._all) == 1 else zlib.crc32(entry_id.encode()) % len(self._all)

    def of(self, entry_id: str) -> Shard:
        return self._all[self.index_of(entry_id)]

    def owned(self, key: bytes) -> tuple[Shard, str] | None:
        """(shard, entry id) of an entry key of these shards, read from the key itself; None for anyone else's."""
        prefix, sep, eid = key.decode(errors="replace").rpartition(":e:")
        shard = self._by_prefix.get(prefix) if sep else None
        return None if shard is None or not eid else (shard, eid)

    async def check_agreement(self, conn: Conn) -> None:
        """Every gateway on a Cluster must split the cache into the same shards: with another count they would
        look for entries in other shards and follow other streams, missing each other's answers. The first
        gateway records its count in shard 0 (`{prefix:0}:shards`); one configured differently bypasses the
        cache and says why, until the count is fixed (or, to change it for good, the prefix's keys and that
        one are deleted)."""
        key = f"{self._all[0].prefix}:shards"
        n = len(self._all)
        await conn.bg.set(key, n, nx=True)
        stored = await conn.bg.get(key)
        if stored is not None and int(stored) != n:
            if not self._mismatch_logged:
                log.error("cache_cluster_shards_mismatch", url=conn.url, configured=n, in_redis=int(stored),
                          fix=f"set cluster_shards to {int(stored)} like the other gateways (see docs/cache.md)")
                self._mismatch_logged = True
            raise Misconfigured(f"this gateway splits the cache into {n} shards, the others into {int(stored)}")
