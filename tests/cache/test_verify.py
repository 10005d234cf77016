"""The verifier: the error bound's verdict turned into a lookup result, the judged comparison once the tier has
answered, and client feedback (in-process store and shared state; a recording judge)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.cache.helpers import RULE, SETTINGS, answer, chat, fresh_metrics, sample
from tiergate.cache.errbound import EDGES, new_counts, region
from tiergate.cache.index import VectorIndex
from tiergate.cache.keys import RequestKey, request_key
from tiergate.cache.shared import HitRecord, MemoryShared
from tiergate.cache.store import MemoryStore
from tiergate.cache.types import CacheEntry, CacheHit
from tiergate.cache.verify import Feedback, LookupResult, Verifier

pytestmark = pytest.mark.anyio

BOUNDED = dataclasses.replace(RULE, max_false_hit_rate=0.10, verify_rate=0.0)
TENANT = "acme"
CACHED = "Invest in a broad index fund."


class Judge:
    """Says what it is told, and remembers what it was asked."""

    def __init__(self, verdict: bool | None) -> None:
        self.verdict = verdict
        self.asked: list[tuple[str, str, str]] = []

    async def same(self, question: str, cached: str, fresh: str) -> bool | None:
        self.asked.append((question, cached, fresh))
        return self.verdict


class Parts:
    def __init__(self, judge: Judge | None, axis: str = "") -> None:
        self.metrics, self.registry = fresh_metrics()
        self.store = MemoryStore(VectorIndex(4), max_entries=100)
        self.shared = MemoryShared(SETTINGS.entry_memory_s, SETTINGS.feedback_ttl_s)
        self.judge = judge
        self.verifier = Verifier(self.store, self.shared, judge, SETTINGS, self.metrics, axis=axis)


def key(text: str = "How do I invest my money wisely?", tenant: str = TENANT) -> RequestKey:
    return request_key(chat(text), tenant)


def entry(entry_id: str = "e-1") -> CacheEntry:
    return CacheEntry(id=entry_id, tenant=TENANT, namespace="ns", text="how can i invest my money wisely",
                      answer=answer(CACHED), expires_at=4e9)


def hit_for(k: RequestKey) -> LookupResult:
    return LookupResult(CacheHit(answer(CACHED), "hit-semantic", 0.995, "e-1", "ns"), "hit-semantic", None, k)


async def certify(p: Parts, at: float = 0.99, tenant: str = TENANT) -> None:
    """Shared evidence of many right answers at cosine `at`: enough for the bound to certify a cutoff there."""
    c = new_counts()
    cell = int(np.searchsorted(EDGES, at, side="right"))
    c[0, region(1.0), cell] = c[1, region(1.0), cell] = 5000
    await p.shared.add_counts({tenant: c})
    await p.verifier.errbound.ensure(tenant)
    assert p.verifier.errbound.cutoff(tenant, 0.10, 1.0) <= at


async def test_a_certified_candidate_is_the_hit_it_was() -> None:
    p = Parts(Judge(True))
    await certify(p)
    k = key()
    h = hit_for(k)
    assert await p.verifier.decide(k, entry(), 0.995, 1.0, BOUNDED, h) is h
    await p.verifier.settle(k, answer("fresh"))
    assert p.judge.asked == []  # nothing was left to compare


async def test_without_evidence_a_near_candidate_is_a_miss_whose_answer_is_judged_once_the_tier_answers() -> None:
    p = Parts(Judge(False))
    k = key()
    got = await p.verifier.decide(k, entry(), 0.97, 1.0, BOUNDED, hit_for(k))
    assert (got.hit, got.status, got.reason, got.key) == (None, "miss", "judge", k)
    await p.verifier.settle(k, answer("Pay off debt first."))
    assert p.judge.asked == [(k.text, CACHED, "Pay off debt first.")]
    assert sample(p.registry, "tiergate_cache_verifications_total", tenant=TENANT, source="judge",
                  result="wrong") == 1
    # found wrong at 0.97: that entry is served afterwards only from just above it
    threshold = await p.shared.entry_threshold("e-1")
    assert threshold is not None and 0.97 < threshold < 0.9702
    await p.verifier.settle(k, answer("again"))  # settled once: a second answer is not judged
    assert len(p.judge.asked) == 1


async def test_a_right_verdict_is_counted_and_leaves_the_entry_alone() -> None:
    p = Parts(Judge(True))
    k = key()
    await p.verifier.decide(k, entry(), 0.97, 1.0, BOUNDED, hit_for(k))
    await p.verifier.settle(k, answer("same"))
    assert sample(p.registry, "tiergate_cache_verifications_total", tenant=TENANT, source="judge",
                  result="right") == 1
    assert await p.shared.entry_threshold("e-1") is None


async def test_a_judge_without_a_verdict_teaches_nothing_and_is_counted_as_an_error() -> None:
    p = Parts(Judge(None))
    k = key()
    await p.verifier.decide(k, entry(), 0.97, 1.0, BOUNDED, hit_for(k))
    await p.verifier.settle(k, answer("fresh"))
    assert sample(p.registry, "tiergate_cache_errors_total", op="judge") == 1
    for result in ("right", "wrong"):
        assert sample(p.registry, "tiergate_cache_verifications_total", tenant=TENANT, source="judge",
                      result=result) == 0
    assert await p.shared.entry_threshold("e-1") is None


async def test_without_a_judge_nothing_is_remembered_and_a_shadow_check_is_a_plain_hit() -> None:
    p = Parts(None)
    k = key()
    assert await p.verifier.decide(k, entry(), 0.97, 1.0, BOUNDED, hit_for(k)) == LookupResult(None, "miss", None, k)
    await p.verifier.settle(k, answer("fresh"))  # nothing pending, no judge: a no-op
    certified = Parts(None)
    await certify(certified)
    shadow = dataclasses.replace(BOUNDED, verify_rate=1.0, verify_mode="shadow")
    h = hit_for(k)
    assert await certified.verifier.decide(k, entry(), 0.995, 1.0, shadow, h) is h


async def test_a_far_candidate_is_a_plain_miss() -> None:
    p = Parts(Judge(True))
    k = key()
    assert await p.verifier.decide(k, entry(), 0.85, 1.0, BOUNDED, hit_for(k)) == LookupResult(None, "miss", None, k)
    await p.verifier.settle(k, answer("fresh"))
    assert p.judge.asked == []


async def test_a_sampled_would_be_hit_goes_to_the_tier_or_is_served_and_checked_in_the_shadow() -> None:
    p = Parts(Judge(True))
    await certify(p)
    k = key()
    tier = dataclasses.replace(BOUNDED, verify_rate=1.0)
    got = await p.verifier.decide(k, entry(), 0.995, 1.0, tier, hit_for(k))
    assert (got.hit, got.status, got.reason) == (None, "miss", "verify")
    await p.verifier.settle(k, answer("fresh"))
    assert sample(p.registry, "tiergate_cache_verifications_total", tenant=TENANT, source="verify",
                  result="right") == 1

    shadow = dataclasses.replace(tier, verify_mode="shadow")
    h = hit_for(k)
    got = await p.verifier.decide(k, entry(), 0.995, 1.0, shadow, h)
    assert (got.hit, got.status, got.reason, got.key) == (h.hit, "hit-semantic", "verify", k)
    await p.verifier.settle(k, answer("fresh"))
    assert len(p.judge.asked) == 2


async def test_an_entry_found_wrong_needs_more_than_the_cutoff_afterwards() -> None:
    p = Parts(Judge(False))
    await certify(p)
    k = key()
    await p.shared.raise_entry_threshold("e-1", 0.999)
    got = await p.verifier.decide(k, entry(), 0.995, 1.0, BOUNDED, hit_for(k))
    assert got.hit is None and got.status == "miss"
    other = await p.verifier.decide(k, entry("e-2"), 0.995, 1.0, BOUNDED, hit_for(k))
    assert other.status == "hit-semantic"  # only that entry is held to its own threshold


async def test_only_the_newest_candidates_wait_for_their_answer() -> None:
    p = Parts(Judge(True))
    keys = [key(f"question number {i}?") for i in range(4097)]
    for k in keys:
        await p.verifier.decide(k, entry(), 0.97, 1.0, BOUNDED, hit_for(k))
    await p.verifier.settle(keys[0], answer("fresh"))  # the oldest was dropped
    assert p.judge.asked == []
    await p.verifier.settle(keys[1], answer("fresh"))
    assert len(p.judge.asked) == 1
    p.verifier.forget()
    await p.verifier.settle(keys[2], answer("fresh"))  # forgotten
    assert len(p.judge.asked) == 1


async def test_each_axis_keeps_its_own_evidence_and_entry_thresholds() -> None:
    p = Parts(Judge(False), axis="v1")
    assert p.verifier.scoped(TENANT) == "acme@v1"
    k = key()
    await p.verifier.decide(k, entry(), 0.97, 1.0, BOUNDED, hit_for(k))
    await p.verifier.settle(k, answer("fresh"))
    assert await p.shared.entry_threshold("e-1@v1") is not None
    assert await p.shared.entry_threshold("e-1") is None
    assert sample(p.registry, "tiergate_cache_verifications_total", tenant="acme@v1", source="judge",
                  result="wrong") == 1
    assert Parts(None).verifier.scoped(TENANT) == TENANT


# -- feedback -------------------------------------------------------------------------------------------------

async def test_feedback_on_a_semantic_hit_removes_the_entry_raises_its_threshold_and_counts_a_wrong_label() -> None:
    p = Parts(None)
    await p.store.put(entry(), None)
    hit = CacheHit(answer(CACHED), "hit-semantic", 0.96, "e-1", "ns", overlap=1.0)
    await p.verifier.served("req-1", TENANT, hit)
    got = await p.verifier.feedback(TENANT, "req-1")
    assert got is not None
    assert (got.entry_id, got.kind, got.removed, got.already_reported) == ("e-1", "hit-semantic", 1, False)
    assert got.threshold is not None and 0.96 < got.threshold < 0.9602
    assert await p.shared.entry_threshold("e-1") == got.threshold
    assert await p.store.get_many("ns", ["e-1"]) == [None]
    assert sample(p.registry, "tiergate_cache_verifications_total", tenant=TENANT, source="feedback",
                  result="wrong") == 1
    assert sample(p.registry, "tiergate_cache_feedback_total", result="applied") == 1
    assert sample(p.registry, "tiergate_cache_invalidated_entries_total", scope="feedback") == 1

    again = await p.verifier.feedback(TENANT, "req-1")
    assert again == Feedback("e-1", "hit-semantic", 0, None, True)
    assert sample(p.registry, "tiergate_cache_feedback_total", result="repeated") == 1
    assert sample(p.registry, "tiergate_cache_verifications_total", tenant=TENANT, source="feedback",
                  result="wrong") == 1


async def test_feedback_on_an_exact_hit_only_removes_the_entry() -> None:
    p = Parts(None)
    await p.store.put(entry(), None)
    await p.verifier.served("req-1", TENANT, CacheHit(answer(CACHED), "hit-exact", 1.0, "e-1", "ns"))
    assert await p.verifier.feedback(TENANT, "req-1") == Feedback("e-1", "hit-exact", 1, None, False)
    assert await p.shared.entry_threshold("e-1") is None
    assert sample(p.registry, "tiergate_cache_verifications_total", tenant=TENANT, source="feedback",
                  result="wrong") == 0


async def test_feedback_uses_the_bound_score_when_a_verifier_scored_the_hit() -> None:
    p = Parts(None, axis="v1")
    hit = CacheHit(answer(CACHED), "hit-semantic", 0.96, "e-1", "ns", bound_score=0.5)
    await p.verifier.served("req-1", TENANT, hit)
    got = await p.verifier.feedback(TENANT, "req-1")
    assert got is not None and got.removed == 0  # the entry was gone already
    assert got.threshold is not None and 0.5 < got.threshold < 0.5002
    assert await p.shared.entry_threshold("e-1@v1") == got.threshold


async def test_feedback_for_an_unknown_or_another_tenants_request_changes_nothing() -> None:
    p = Parts(None)
    await p.store.put(entry(), None)
    await p.verifier.served("req-1", TENANT, CacheHit(answer(CACHED), "hit-semantic", 0.96, "e-1", "ns"))
    assert await p.verifier.feedback("globex", "req-1") is None
    assert await p.verifier.feedback(TENANT, "req-2") is None
    assert sample(p.registry, "tiergate_cache_feedback_total", result="unknown") == 2
    assert await p.store.get_many("ns", ["e-1"]) != [None]
    assert (await p.verifier.feedback(TENANT, "req-1")) is not None  # still reportable by its own tenant


async def test_a_hit_that_cannot_be_remembered_is_counted_not_raised() -> None:
    p = Parts(None)

    async def down(request_id: str, record: HitRecord) -> None:
        raise ConnectionError("redis is down")

    p.shared.remember_hit = down  # type: ignore[method-assign]
    await p.verifier.served("req-1", TENANT, CacheHit(answer(CACHED), "hit-exact", 1.0, "e-1", "ns"))
    assert sample(p.registry, "tiergate_cache_errors_total", op="remember_hit") == 1
