"""Selection: rendezvous affinity per prompt prefix, bounded by load; round-robin and least-load."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from tiergate.core.pool import Endpoint
from tiergate.core.wire import ChatRequest, CompletionRequest, Message
from tiergate.gateway.pools.selection import Selector, affinity_key, rendezvous_order


def eps(n: int, slots: int = 8) -> list[Endpoint]:
    return [Endpoint(id=f"10.0.0.{i}:8000", base_url=f"http://10.0.0.{i}:8000", model="m", tier="cloud", slots=slots)
            for i in range(n)]


def chat(system: str, user: str) -> ChatRequest:
    return ChatRequest(model="m", messages=[Message(role="system", content=system), Message(role="user", content=user)])


SYSTEM = "You are a meticulous assistant for the billing team. " * 10  # longer than the affinity window


def test_key_depends_on_the_prefix_window_only() -> None:
    assert affinity_key(chat(SYSTEM, "a"), 256) == affinity_key(chat(SYSTEM, "b"), 256)
    assert affinity_key(chat(SYSTEM, "a"), 256) != affinity_key(chat("Other. " + SYSTEM, "a"), 256)
    # Short system prompts: the user turn falls inside the window, so different questions differ.
    assert affinity_key(chat("Be brief.", "a"), 256) != affinity_key(chat("Be brief.", "b"), 256)
    # Roles are part of the key: the same words as system vs user are different prompts.
    as_user = ChatRequest(model="m", messages=[Message(role="user", content=SYSTEM)])
    assert affinity_key(as_user, 256) != affinity_key(chat(SYSTEM, "a"), 256)
    assert affinity_key(CompletionRequest(model="m", prompt=""), 256) is None
    assert affinity_key(CompletionRequest(model="m", prompt=["x" * 300, "y"]), 256) == affinity_key(
        CompletionRequest(model="m", prompt="x" * 300), 256)


def test_rendezvous_moves_only_the_keys_of_a_removed_server() -> None:
    servers = eps(5)
    keys = [bytes([i, j]) for i in range(40) for j in range(5)]
    before = {k: rendezvous_order(k, servers)[0].id for k in keys}
    gone = servers[2]
    after = {k: rendezvous_order(k, [s for s in servers if s is not gone])[0].id for k in keys}
    moved = {k for k in keys if before[k] != after[k]}
    assert moved == {k for k in keys if before[k] == gone.id}
    spread = Counter(before.values())
    assert len(spread) == 5 and min(spread.values()) > len(keys) / 5 / 2


def test_idle_pool_sends_a_prefix_to_the_same_server_every_time() -> None:
    sel = Selector("prefix")
    servers = eps(4)
    firsts = {sel.order(chat(SYSTEM, f"question {i}"), servers).order[0].id for i in range(20)}
    choice = sel.order(chat(SYSTEM, "q"), servers)
    assert len(firsts) == 1 and choice.reason == "affinity"
    assert sorted(e.id for e in choice.order) == sorted(e.id for e in servers)


def test_hot_prefix_spills_to_its_next_ranked_server_when_over_the_bound() -> None:
    sel = Selector("prefix", bound=1.25)
    servers = eps(3)
    req = chat(SYSTEM, "q")
    ranked = rendezvous_order(affinity_key(req, 256), servers)
    ranked[0].inflight = 4
    ranked[1].inflight = 1
    ranked[2].inflight = 1
    choice = sel.order(req, servers)
    assert choice.reason == "spill"
    assert choice.order[0] is ranked[1], "the spill goes to the key's second choice, which then warms up"


def test_one_hot_prefix_keeps_load_within_the_bound() -> None:
    """Closed loop: 80% of traffic shares one prefix. Every placement respects the integer capacity
    ceil(1.2 x mean), and the time-averaged max/mean load per server stays <= 1.3."""
    rng = random.Random(7)
    sel = Selector("prefix")
    servers = eps(4, slots=64)
    inflight: list[Endpoint] = []
    totals = Counter()
    reasons = Counter()
    for _ in range(4000):
        req = chat(SYSTEM, "q") if rng.random() < 0.8 else chat(f"tenant {rng.randrange(50)} " * 40, "q")
        before = sum(e.inflight for e in servers)
        choice = sel.order(req, servers)
        reasons[choice.reason] += 1
        ep = choice.order[0]
        ep.inflight += 1
        assert ep.inflight <= math.ceil(1.2 * (before + 1) / 4)
        inflight.append(ep)
        if len(inflight) > 32:  # steady state: 32 requests in flight, a random one finishes
            inflight.pop(rng.randrange(len(inflight))).inflight -= 1
            for e in servers:
                totals[e.id] += e.inflight
    assert max(totals.values()) / (sum(totals.values()) / 4) <= 1.3
    assert reasons["spill"] > 0 and reasons["affinity"] > 0  # the hot prefix overflows its home server


def test_without_a_bound_the_hot_prefix_would_pile_up() -> None:
    """The same workload with an effectively unbounded selector: the failure the bound prevents."""
    sel = Selector("prefix", bound=100.0)
    servers = eps(4, slots=64)
    for _ in range(32):
        sel.order(chat(SYSTEM, "q"), servers).order[0].inflight += 1
    assert max(e.inflight for e in servers) == 32


def test_round_robin_cycles_through_servers_in_a_stable_order() -> None:
    sel = Selector("round_robin")
    servers = eps(3)
    firsts = [sel.order(chat(SYSTEM, "q"), list(reversed(servers))).order[0].id for _ in range(6)]
    assert firsts == [s.id for s in servers] * 2


def test_least_load_prefers_the_least_busy_and_rotates_ties() -> None:
    sel = Selector("least_load")
    servers = eps(3)
    servers[0].reported_load = 0.5
    servers[1].inflight = 2
    choice = sel.order(chat(SYSTEM, "q"), servers)
    assert choice.reason == "least_load" and choice.order[0] is servers[2]
    servers[2].inflight = 2
    servers[0].reported_load = 0.0
    assert sel.order(chat(SYSTEM, "q"), servers).order[0] is servers[0]
    for s in servers:
        s.inflight, s.reported_load = 0, 0.0
    assert {sel.order(chat(SYSTEM, "q"), servers).order[0].id for _ in range(3)} == {s.id for s in servers}


def test_prefix_strategy_without_a_key_falls_back_to_least_load() -> None:
    sel = Selector("prefix")
    servers = eps(2)
    servers[0].inflight = 3
    choice = sel.order(CompletionRequest(model="m", prompt=""), servers)
    assert choice.reason == "no_key" and choice.order[0] is servers[1]


def test_empty_pool_and_bad_options() -> None:
    assert Selector().order(chat("a", "b"), []) is None
    with pytest.raises(ValueError, match="allowed: prefix, round_robin, least_load"):
        Selector("random")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Selector(bound=0.9)


def remembering(n: int, **options) -> tuple[Selector, list[Endpoint]]:
    """A prefix selector whose memory knows every server's cache size (as the pool sets it from /metrics)."""
    sel = Selector("prefix", **options)
    servers = eps(n)
    for ep in servers:
        sel.memory.set_capacity(ep.id, 100_000)
    return sel, servers


def test_a_spilled_prefix_is_found_again_where_it_was_cached() -> None:
    sel, servers = remembering(3)
    req = chat(SYSTEM, "q")
    ranked = rendezvous_order(affinity_key(req, 256), servers)
    ranked[0].inflight = 4  # the first-ranked server is busy: the first request spills and is cached there
    ranked[1].inflight = 1
    ranked[2].inflight = 1
    assert sel.order(req, servers, tokens=300).order[0] is ranked[1]
    for ep in servers:
        ep.inflight = 0
    choice = sel.order(req, servers, tokens=300)  # all idle again
    assert choice.order[0] is ranked[1] and choice.reason == "cached"


def test_a_server_holding_the_prefix_takes_it_up_to_the_cached_bound() -> None:
    """Loads 4, 2, 2 (+1): bound 1.2 caps each server at ceil(1.2 x 9 / 3) = 4, so without the prefix in its
    cache the first-ranked server spills; holding it, its cap is ceil(1.8 x 9 / 3) = 6."""
    req = chat(SYSTEM, "q")

    def first_after_a_visit(sel: Selector, servers: list[Endpoint]) -> tuple[Endpoint, Endpoint, str]:
        ranked = rendezvous_order(affinity_key(req, 256), servers)
        sel.order(req, servers, tokens=300)  # idle: the first-ranked server takes it (and caches it)
        ranked[0].inflight, ranked[1].inflight, ranked[2].inflight = 4, 2, 2
        choice = sel.order(req, servers, tokens=300)
        return ranked[0], choice.order[0], choice.reason

    home, chosen, reason = first_after_a_visit(*remembering(3))
    assert chosen is home and reason == "affinity"
    home, chosen, reason = first_after_a_visit(*remembering(3, cached_bound=1.2))  # the allowance turned off
    assert chosen is not home and reason == "spill"
    home, chosen, reason = first_after_a_visit(Selector("prefix"), eps(3))  # sizes unknown: nothing remembered
    assert chosen is not home and reason == "spill"


def test_a_hot_cached_prefix_stays_within_the_cached_bound() -> None:
    rng = random.Random(3)
    sel, servers = remembering(4, bound=1.2, cached_bound=1.8)
    inflight: list[Endpoint] = []
    for _ in range(2000):
        req = chat(SYSTEM, "q") if rng.random() < 0.8 else chat(f"tenant {rng.randrange(50)} " * 40, "q")
        before = sum(e.inflight for e in servers)
        ep = sel.order(req, servers, tokens=300).order[0]
        ep.inflight += 1
        assert ep.inflight <= math.ceil(1.8 * (before + 1) / 4)
        inflight.append(ep)
        if len(inflight) > 32:
            inflight.pop(rng.randrange(len(inflight))).inflight -= 1


def test_cached_bound_below_the_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="cached_bound"):
        Selector("prefix", bound=1.5, cached_bound=1.2)
    assert Selector("prefix", bound=1.2).cached_bound == pytest.approx(1.8)
