"""Error-bounded semantic hits: the certified cutoff, the decision, the labels, feedback (in-process store)."""

from __future__ import annotations

import dataclasses
import math
import random

import numpy as np
import pytest

from cache import build_cache
from cache.errbound import EDGES, ErrorBound, certified_cutoff, estimate
from cache.settings import CacheSettings
from cache.shared import MemoryShared
from tests.cache.helpers import RULE, SETTINGS, answer, chat, fresh_metrics, sample

pytestmark = pytest.mark.anyio

BOUNDED = dataclasses.replace(RULE, max_false_hit_rate=0.10, verify_rate=0.0)
Q, PARA = "How do I invest my money wisely?", "How can I invest my money wisely?"


def counts(sims: np.ndarray, wrong: np.ndarray) -> np.ndarray:
    c = np.zeros((3, len(EDGES) + 1), np.int64)
    cells = np.searchsorted(EDGES, sims, side="right")
    np.add.at(c[0], cells, 1)
    np.add.at(c[1], cells, 1)
    np.add.at(c[2], cells[wrong], 1)
    return c


def synthetic(n: int = 20_000, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Cosines in [0.8, 1) whose chance of being a wrong hit falls from 40 % to 2 % as they rise."""
    rng = np.random.default_rng(seed)
    sims = rng.uniform(0.8, 0.9999, n)
    p_wrong = 0.40 - (sims - 0.8) / 0.2 * 0.38
    return sims, rng.random(n) < p_wrong


def test_no_evidence_certifies_nothing():
    assert certified_cutoff(np.zeros((3, len(EDGES) + 1), np.int64), 0.1) == math.inf
    sims, wrong = synthetic(100)  # fewer than 30/δ lookups above any cutoff
    assert certified_cutoff(counts(sims, wrong), 0.1) == math.inf


def test_the_cutoff_holds_the_bound_and_loosens_with_it():
    sims, wrong = synthetic()
    c = counts(sims, wrong)
    cut10, cut20 = certified_cutoff(c, 0.10), certified_cutoff(c, 0.20)
    assert 0.8 <= cut20 < cut10 < 1.0
    for delta, cut in ((0.10, cut10), (0.20, cut20)):
        served = sims >= cut
        assert wrong[served].mean() <= delta  # the true rate above the certified cutoff
        point, upper = estimate(c, cut)
        assert point <= upper <= delta
    assert certified_cutoff(c, 0.01) == math.inf  # 2 % wrong even at the top: a 1 % bound is out of reach


async def test_decisions_count_lookups_and_labels_move_the_cutoff():
    metrics, reg = fresh_metrics()
    eb = ErrorBound(MemoryShared(60, 60), CacheSettings(), metrics, rng=random.Random(3))
    v = eb.decide("acme", 0.97, 0.10, 0.0)
    assert v.action == "judge" and v.cutoff == math.inf  # cold: nothing served, a near miss is judged
    assert eb.decide("acme", 0.90, 0.10, 0.0).action == "miss"
    assert eb.decide("acme", 0.5, 0.10, 0.0).action == "miss"
    sims, wrong = synthetic()
    eb.seed("acme", sims, wrong)
    cut = eb.cutoff("acme", 0.10)
    assert math.isfinite(cut)
    assert eb.decide("acme", cut + 0.001, 0.10, 0.0).action == "hit"
    assert eb.decide("acme", cut + 0.001, 0.10, 1.0).action == "verify"
    assert eb.decide("acme", cut - 0.01, 0.10, 0.0).action == "judge"
    assert eb.decide("acme", cut + 0.001, 0.10, 0.0, entry_threshold=cut + 0.002).action in ("judge", "miss")
    for _ in range(400):  # evidence that the served cells are wrong: the cutoff rises
        eb.record("acme", cut + 0.002, True, "verify")
    assert eb.cutoff("acme", 0.10) > cut
    assert sample(reg, "tiergate_cache_verifications_total", tenant="acme", source="verify", result="wrong") == 400
    assert eb.cutoff("globex", 0.10) == math.inf  # another tenant's evidence is its own


async def test_gateways_share_their_counts():
    shared = MemoryShared(60, 60)
    a = ErrorBound(shared, CacheSettings(), fresh_metrics()[0])
    b = ErrorBound(shared, CacheSettings(), fresh_metrics()[0])
    sims, wrong = synthetic()
    a.seed("acme", sims, wrong)
    assert b.cutoff("acme", 0.10) == math.inf
    await a.sync()
    await b.sync()
    assert b.cutoff("acme", 0.10) == a.cutoff("acme", 0.10) and math.isfinite(b.cutoff("acme", 0.10))
    assert (b.counts("acme") == a.counts("acme")).all()


class Judge:
    """Says what the test tells it to."""

    def __init__(self) -> None:
        self.verdict: bool | None = True
        self.calls: list[tuple[str, str, str]] = []

    async def same(self, question: str, cached: str, fresh: str) -> bool | None:
        self.calls.append((question, cached, fresh))
        return self.verdict


@pytest.fixture
async def bounded_cache(onnx_embedder):
    metrics, registry = fresh_metrics()
    judge = Judge()
    cache = build_cache(None, None, embedder=onnx_embedder, metrics=metrics, settings=SETTINGS, judge=judge)
    await cache.start()
    yield cache, registry, judge
    await cache.stop()


def certify(cache, tenant: str = "acme") -> float:
    """Evidence that everything above 0.95 is right: the cutoff comes down to there."""
    sims = np.concatenate([np.linspace(0.95, 0.9999, 2000), np.linspace(0.80, 0.9499, 2000)])
    wrong = np.concatenate([np.zeros(2000, bool), np.ones(2000, bool)])
    cache.errbound.seed(tenant, sims, wrong)
    return cache.errbound.cutoff(tenant, BOUNDED.max_false_hit_rate)


async def test_a_bounded_rule_serves_nothing_semantic_until_there_is_evidence(bounded_cache):
    cache, reg, judge = bounded_cache
    await cache.store(chat(Q), "acme", BOUNDED, answer("Diversify."))
    assert (await cache.check(chat(Q), "acme", BOUNDED)).status == "hit-exact"  # exact hits are not bounded
    cold = await cache.check(chat(PARA), "acme", BOUNDED)
    assert cold.status == "miss" and cold.reason == "judge"  # 0.978: near enough to learn from
    await cache.store(chat(PARA), "acme", BOUNDED, answer("Diversify, and keep costs low."))
    assert judge.calls == [(PARA, "Diversify.", "Diversify, and keep costs low.")]
    assert sample(reg, "tiergate_cache_verifications_total", tenant="acme", source="judge", result="right") == 1
    assert certify(cache) <= 0.955
    await cache.invalidate(entry_id=cold.key.entry_id)  # the paraphrase's own answer: not the one to hit
    warm = await cache.check(chat(PARA), "acme", BOUNDED)
    assert warm.status == "hit-semantic" and warm.hit.answer.text == "Diversify."
    assert sample(reg, "tiergate_cache_semantic_threshold_count") >= 1
    assert (await cache.check(chat(PARA), "acme", RULE)).status == "hit-semantic"  # an unbounded rule: as before


async def test_a_verified_hit_found_wrong_raises_its_entry_threshold(bounded_cache):
    cache, reg, judge = bounded_cache
    certify(cache)
    await cache.store(chat(Q), "acme", BOUNDED, answer("Diversify."))
    always = dataclasses.replace(BOUNDED, verify_rate=1.0)
    res = await cache.check(chat(PARA), "acme", always)
    assert res.status == "miss" and res.reason == "verify"  # a would-be hit, sent to the tier instead
    judge.verdict = False
    await cache.store(chat(PARA), "acme", always, answer("Buy lottery tickets."), res.key)
    assert sample(reg, "tiergate_cache_verifications_total", tenant="acme", source="verify", result="wrong") == 1
    entry = (await cache.check(chat(Q), "acme", BOUNDED)).hit.entry_id
    own = await cache.shared.entry_threshold(entry)
    assert own is not None and own > 0.97
    await cache.invalidate(entry_id=res.key.entry_id)
    again = await cache.check(chat(PARA), "acme", BOUNDED)
    assert again.status == "miss"  # that entry is no longer served at that similarity


async def test_feedback_invalidates_and_tightens_and_only_for_the_tenant_that_got_the_answer(bounded_cache):
    cache, reg, _ = bounded_cache
    certify(cache)
    await cache.store(chat(Q), "acme", BOUNDED, answer("Diversify."))
    hit = (await cache.check(chat(PARA), "acme", BOUNDED)).hit
    assert hit is not None and hit.kind == "hit-semantic"
    await cache.served("req-1", "acme", hit)

    assert await cache.feedback("acme", "req-unknown") is None
    assert await cache.feedback("globex", "req-1") is None  # another tenant's request id: unknown to it
    assert (await cache.check(chat(Q), "acme", BOUNDED)).status == "hit-exact"  # nothing changed

    done = await cache.feedback("acme", "req-1")
    assert done.removed == 1 and done.kind == "hit-semantic" and done.threshold > hit.similarity
    assert not done.already_reported
    assert (await cache.check(chat(Q), "acme", BOUNDED)).status == "miss"  # invalidated
    again = await cache.feedback("acme", "req-1")
    assert again.already_reported and again.removed == 0
    await cache.store(chat(Q), "acme", BOUNDED, answer("Diversify."))  # the same question answered again
    assert (await cache.check(chat(PARA), "acme", BOUNDED)).status != "hit-semantic"  # keeps its threshold
    assert sample(reg, "tiergate_cache_feedback_total", result="applied") == 1
    assert sample(reg, "tiergate_cache_feedback_total", result="unknown") == 2
    assert sample(reg, "tiergate_cache_verifications_total", tenant="acme", source="feedback", result="wrong") == 1
