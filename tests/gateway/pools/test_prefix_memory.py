"""PrefixMemory: per server, the prefixes it was sent most recently, up to its KV cache size in tokens."""

from __future__ import annotations

from tiergate.core.pool import Endpoint
from tiergate.gateway.pools.prefix_memory import PrefixMemory


def eps(*ids: str) -> list[Endpoint]:
    return [Endpoint(id=i, base_url=f"http://{i}", model="m", tier="cloud") for i in ids]


def test_a_server_holds_its_most_recent_prefixes_up_to_its_cache_size() -> None:
    mem = PrefixMemory()
    a, b = eps("a", "b")
    mem.set_capacity("a", 1000)
    mem.set_capacity("b", 1000)
    for key in (b"k1", b"k2", b"k3"):
        mem.record("a", key, 300)
    mem.record("b", b"k1", 300)
    assert mem.holders(b"k1", [a, b]) == [a, b]
    mem.record("a", b"k1", 300)  # sent again: now the most recent on a
    mem.record("a", b"k4", 300)  # 1,200 tokens: the least recently sent (k2) goes
    assert mem.holders(b"k2", [a, b]) == []
    assert mem.holders(b"k1", [b, a]) == [b, a]  # in the order asked
    assert mem.size("a") == (3, 900)


def test_nothing_is_remembered_for_a_server_of_unknown_cache_size() -> None:
    mem = PrefixMemory()
    (a,) = eps("a")
    mem.record("a", b"k", 100)
    assert mem.holders(b"k", [a]) == [] and mem.size("a") == (0, 0)
    mem.set_capacity("a", 500)
    mem.record("a", b"k", 100)
    mem.set_capacity("a", None)  # the server stopped reporting its size: no guesses
    assert mem.holders(b"k", [a]) == []


def test_a_smaller_cache_trims_and_a_restart_empties() -> None:
    mem = PrefixMemory()
    (a,) = eps("a")
    mem.set_capacity("a", 1000)
    for key in (b"k1", b"k2", b"k3"):
        mem.record("a", key, 300)
    mem.set_capacity("a", 600)
    assert [k for k in (b"k1", b"k2", b"k3") if mem.holders(k, [a])] == [b"k2", b"k3"]
    mem.record("a", b"huge", 10_000)  # a prompt larger than the cache holds at most the cache
    assert mem.size("a") == (1, 600)
    mem.forget("a")
    assert mem.size("a") == (0, 0)
    mem.record("a", b"k1", 100)  # the size is kept: it remembers again at once
    assert mem.holders(b"k1", [a]) == [a]


def test_the_number_of_keys_is_bounded_whatever_the_cache_size() -> None:
    mem = PrefixMemory(max_keys=3)
    (a,) = eps("a")
    mem.set_capacity("a", 10**9)
    for i in range(5):
        mem.record("a", bytes([i]), 1)
    assert mem.size("a") == (3, 3) and mem.holders(bytes([4]), [a]) == [a] and not mem.holders(bytes([1]), [a])
