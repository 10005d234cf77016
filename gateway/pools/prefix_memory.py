"""Where each prompt prefix is probably cached: the servers that took its key recently, sized to their KV cache.

vLLM keeps a prompt's KV blocks after the request ends and evicts the least recently used ones when it needs
room. The gateway cannot see which blocks a server holds, but it knows what it sent where: per server, an LRU of
affinity keys, each counted at its prompt's size in tokens, holding no more tokens than the server's KV cache
(`num_gpu_blocks` x `block_size`, read from its /metrics). A key in a server's LRU is a key that server probably
still holds. Selection uses this in two ways (`gateway.pools.selection`): a server that holds the prefix is tried
before the key's other servers, and may take the request at a higher load bound, since a cached request costs it
only the uncached suffix. A server whose KV size is not known yet gets nothing remembered (no guess), and a
restarted server (its counters went back) starts empty.

This is an estimate, as vllm-router's approximate radix tree is: other gateway replicas send traffic too, and
vLLM evicts by block, not by prompt. An overestimate costs one request a miss at the higher bound; it never
sends a request to a server that is not routable.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tiergate.core.pool import Endpoint

__all__ = ["PrefixMemory"]


class _ServerLru:
    __slots__ = ("capacity", "keys", "max_keys", "used")

    def __init__(self, capacity: int, max_keys: int) -> None:
        self.capacity = capacity  # tokens
        self.max_keys = max_keys
        self.keys: OrderedDict[bytes, int] = OrderedDict()  # key → tokens, least recently sent first
        self.used = 0

    def add(self, key: bytes, tokens: int) -> None:
        self.used -= self.keys.pop(key, 0)
        tokens = min(tokens, self.capacity)
        self.keys[key] = tokens
        self.used += tokens
        self.trim()

    def trim(self) -> None:
        while self.used > self.capacity or len(self.keys) > self.max_keys:
            _, size = self.keys.popitem(last=False)
            self.used -= size


class PrefixMemory:
    """Per server, the affinity keys it was sent most recently, up to its KV cache size in tokens."""

    def __init__(self, max_keys: int = 65_536) -> None:
        self.max_keys = max_keys  # per server, whatever its cache size: bounds the gateway's memory (~10 MB)
        self._servers: dict[str, _ServerLru] = {}

    def set_capacity(self, endpoint_id: str, tokens: int | None) -> None:
        """The server's KV cache size in tokens (None: unknown, remember nothing). A smaller size trims now."""
        if not tokens or tokens <= 0:
            self._servers.pop(endpoint_id, None)
            return
        lru = self._servers.get(endpoint_id)
        if lru is None:
            self._servers[endpoint_id] = _ServerLru(tokens, self.max_keys)
        else:
            lru.capacity = tokens
            lru.trim()

    def forget(self, endpoint_id: str) -> None:
        """The server restarted or left: its cache is empty (capacity is kept until the next reading)."""
        lru = self._servers.get(endpoint_id)
        if lru is not None:
            self._servers[endpoint_id] = _ServerLru(lru.capacity, self.max_keys)

    def record(self, endpoint_id: str, key: bytes, tokens: int) -> None:
        """`endpoint_id` was sent a prompt of `tokens` tokens whose prefix has `key`."""
        lru = self._servers.get(endpoint_id)
        if lru is not None:
            lru.add(key, max(tokens, 1))

    def holders(self, key: bytes, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        """The endpoints (in the given order) that probably hold `key`'s prefix."""
        return [ep for ep in endpoints if (lru := self._servers.get(ep.id)) is not None and key in lru.keys]

    def size(self, endpoint_id: str) -> tuple[int, int]:
        """(keys, tokens) remembered for a server: for its metrics."""
        lru = self._servers.get(endpoint_id)
        return (len(lru.keys), lru.used) if lru is not None else (0, 0)
