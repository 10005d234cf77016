"""The eviction order of a store shared by tenants (`cache.shares`)."""

from __future__ import annotations

from tiergate.cache.shares import TenantShares, tag_of


def test_the_largest_holder_gives_up_its_soonest_expiring_entry() -> None:
    shares = TenantShares()
    for i in range(3):
        shares.add(f"small-{i}", 10.0 + i)  # the oldest entries of all
    for i in range(5):
        shares.add(f"flood-{i}", 100.0 + i)
    assert shares.victim() == "flood-0"
    shares.remove("flood-0")
    assert shares.victim() == "flood-1"
    assert shares.held("flood") == 4 and shares.held("small") == 3 and len(shares) == 7


def test_one_tenant_is_a_plain_soonest_expiring_bound() -> None:
    shares = TenantShares()
    for eid, exp in [("t-b", 5.0), ("t-a", 1.0), ("t-c", 9.0)]:
        shares.add(eid, exp)
    shares.add("t-a", 20.0)  # stored again: its old expiry no longer counts
    assert shares.victim() == "t-b"


def test_removing_every_entry_forgets_the_tenant() -> None:
    shares = TenantShares()
    shares.add("x-1", 1.0)
    shares.remove("x-1")
    shares.remove("x-1")  # twice, or an id never added: nothing happens
    shares.remove("y-1")
    assert shares.victim() is None and len(shares) == 0
    assert tag_of("abc-def-1") == "abc"


def test_many_restores_keep_the_order_compact() -> None:
    shares = TenantShares()
    for n in range(5000):
        shares.add("t-1", float(n))
    assert shares.victim() == "t-1" and len(shares._order["t"]) <= 4 * 256 + 1
