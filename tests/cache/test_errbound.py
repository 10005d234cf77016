"""Error-bounded semantic hits: the certified cutoff, the decision, the labels, feedback (in-process store)."""

from __future__ import annotations

import dataclasses
import math
import random

import numpy as np
import pytest

from tests.cache.helpers import RULE, SETTINGS, answer, chat, fresh_metrics, sample
from tiergate.cache import build_cache
from tiergate.cache.errbound import (
    EDGES,
    OVERLAP_EDGES,
    ErrorBound,
    certified_cutoffs,
    estimate,
    new_counts,
    region,
)
from tiergate.cache.settings import CacheSettings
from tiergate.cache.shared import MemoryShared

pytestmark = pytest.mark.anyio

BOUNDED = dataclasses.replace(RULE, max_false_hit_rate=0.10, verify_rate=0.0)
Q, PARA = "How do I invest my money wisely?", "How can I invest my money wisely?"


def counts(sims: np.ndarray, wrong: np.ndarray, overlaps: np.ndarray | None = None) -> np.ndarray:
    """Counts of labelled lookups, written out by hand (all in the top region unless `overlaps` says)."""
    c = new_counts()
    regions = np.searchsorted(OVERLAP_EDGES, np.ones(len(sims)) if overlaps is None else overlaps, side="right")
    cells = np.searchsorted(EDGES, sims, side="right")
    np.add.at(c[0], (regions, cells), 1)
    np.add.at(c[1], (regions, cells), 1)
    np.add.at(c[2], (regions[wrong], cells[wrong]), 1)
    return c


def top(cutoffs: np.ndarray) -> float:
    """The cutoff of the top overlap region (where `counts` puts everything by default)."""
    return float(cutoffs[-1])


def synthetic(n: int = 20_000, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Cosines in [0.8, 1) whose chance of being a wrong hit falls from 40 % to 2 % as they rise."""
    rng = np.random.default_rng(seed)
    sims = rng.uniform(0.8, 0.9999, n)
    p_wrong = 0.40 - (sims - 0.8) / 0.2 * 0.38
    return sims, rng.random(n) < p_wrong


def test_no_evidence_certifies_nothing():
    assert np.isinf(certified_cutoffs(new_counts(), 0.1)).all()
    sims, wrong = synthetic(100)  # fewer than 30/δ lookups above any cutoff
    assert np.isinf(certified_cutoffs(counts(sims, wrong), 0.1)).all()


def test_the_cutoff_holds_the_bound_and_loosens_with_it():
    sims, wrong = synthetic()
    c = counts(sims, wrong)
    cuts10, cuts20 = certified_cutoffs(c, 0.10), certified_cutoffs(c, 0.20)
    assert np.isinf(cuts10[:-1]).all()  # regions without evidence serve nothing
    cut10, cut20 = top(cuts10), top(cuts20)
    assert 0.8 <= cut20 < cut10 < 1.0
    for delta, cuts, cut in ((0.10, cuts10, cut10), (0.20, cuts20, cut20)):
        served = sims >= cut
        assert wrong[served].mean() <= delta  # the true rate above the certified cutoff
        point, upper = estimate(c, cuts)
        assert point <= upper <= delta
    assert np.isinf(certified_cutoffs(c, 0.01)).all()  # 2 % wrong even at the top: a 1 % bound is out of reach


def test_each_overlap_region_gets_the_cutoff_its_own_evidence_supports():
    """Questions sharing most content words are rarely wrong at a cosine where those sharing few often are:
    one cutoff per region serves more under the same bound than the single cutoff that holds it."""
    rng = np.random.default_rng(5)
    sims = rng.uniform(0.8, 0.9999, 40_000)
    overlaps = np.repeat([0.1, 0.8], 20_000)
    slope = np.where(overlaps > 0.5, 0.10, 0.60)  # wrong 10 % (high overlap) / 60 % (low) at 0.8, 2 % at the top
    wrong = rng.random(len(sims)) < 0.02 + (0.9999 - sims) / 0.2 * slope
    c = counts(sims, wrong, overlaps)
    cuts = certified_cutoffs(c, 0.10)
    low, high = cuts[region(0.1)], cuts[region(0.8)]
    assert 0.8 <= high < low < 1.0
    served = sims >= np.where(overlaps > 0.5, high, low)
    assert wrong[served].mean() <= 0.10
    one = top(certified_cutoffs(counts(sims, wrong), 0.10))  # the same evidence without regions
    assert served.sum() > (sims >= one).sum()
    assert wrong[sims >= one].mean() <= 0.10


def test_cells_nothing_is_known_about_are_never_served():
    """Spotless evidence between 0.95 and 0.96 certifies the cells above it (a higher cosine is no worse), not
    the ones below it, nor another region: serving those would cost the bound nothing on paper."""
    sims = np.linspace(0.9501, 0.9599, 3000)
    cuts = certified_cutoffs(counts(sims, np.zeros(len(sims), bool)), 0.10)
    assert top(cuts) == 0.95
    assert np.isinf(cuts[:-1]).all()


def test_a_gap_nothing_is_known_about_ends_what_a_region_serves():
    """Spotless evidence at the top, nothing just below it, and a few poor labels further down (worse than the
    no-evidence prior, so nothing pools the gap with them): the few poor cells are cheap enough for the bound,
    but serving them would serve the unknown gap too, so the region is served from the top run only."""
    sims = np.concatenate([np.linspace(0.9701, 0.9799, 3000), np.full(20, 0.8525)])
    wrong = np.concatenate([np.zeros(3000, bool), np.arange(20) < 12])  # 60 % wrong, little traffic
    assert top(certified_cutoffs(counts(sims, wrong), 0.10)) == 0.97


def test_a_region_whose_rate_rises_with_cosine_is_served_from_one_cutoff_up():
    """Noise that makes a cell look worse than the one below it never leaves a hole in what is served."""
    sims = np.concatenate([np.full(3000, 0.9525), np.full(3000, 0.9575), np.full(3000, 0.9625)])
    wrong = np.zeros(len(sims), bool)
    wrong[3000:3000 + 150] = True  # the middle cell 5 % wrong, the ones around it never
    cuts = certified_cutoffs(counts(sims, wrong), 0.10)
    assert top(cuts) <= 0.9525  # pooled with its neighbours: all three served, not the top and bottom only


async def test_decisions_count_lookups_and_labels_move_the_cutoff():
    metrics, reg = fresh_metrics()
    eb = ErrorBound(MemoryShared(60, 60), CacheSettings(), metrics, rng=random.Random(3))
    v = eb.decide("acme", 0.97, 1.0, 0.10, 0.0)
    assert v.action == "judge" and v.cutoff == math.inf  # cold: nothing served, a near miss is judged
    assert eb.decide("acme", 0.90, 1.0, 0.10, 0.0).action == "miss"
    assert eb.decide("acme", 0.5, 1.0, 0.10, 0.0).action == "miss"
    sims, wrong = synthetic()
    eb.seed("acme", sims, np.ones(len(sims)), wrong)
    cut = eb.cutoff("acme", 0.10, 1.0)
    assert math.isfinite(cut)
    assert eb.decide("acme", cut + 0.001, 1.0, 0.10, 0.0).action == "hit"
    assert eb.decide("acme", cut + 0.001, 1.0, 0.10, 1.0).action == "verify"
    assert eb.decide("acme", cut - 0.01, 1.0, 0.10, 0.0).action == "judge"
    assert eb.decide("acme", cut + 0.001, 1.0, 0.10, 0.0, entry_threshold=cut + 0.002).action in ("judge", "miss")
    assert eb.decide("acme", 0.999, 0.1, 0.10, 0.0).action == "judge"  # no evidence in the low-overlap region
    for _ in range(400):  # evidence that the served cells are wrong: the cutoff rises
        eb.record("acme", cut + 0.002, 1.0, True, "verify")
    assert eb.cutoff("acme", 0.10, 1.0) > cut
    assert sample(reg, "tiergate_cache_verifications_total", tenant="acme", source="verify", result="wrong") == 400
    assert eb.cutoff("globex", 0.10, 1.0) == math.inf  # another tenant's evidence is its own


async def test_gateways_share_their_counts():
    shared = MemoryShared(60, 60)
    a = ErrorBound(shared, CacheSettings(), fresh_metrics()[0])
    b_metrics, b_registry = fresh_metrics()
    b = ErrorBound(shared, CacheSettings(), b_metrics)
    sims, wrong = synthetic()
    a.seed("acme", sims, np.linspace(0, 1, len(sims)), wrong)  # every region
    assert np.isinf(b.cutoffs("acme", 0.10)).all()
    await a.sync()
    await b.sync()
    assert (b.cutoffs("acme", 0.10) == a.cutoffs("acme", 0.10)).all() and np.isfinite(b.cutoffs("acme", 0.10)).any()
    assert (b.counts("acme") == a.counts("acme")).all()
    await b.sync()  # the gauges: each region's cutoff, labelled by the region's lower edge
    for g, edge in enumerate(("0", "0.2", "0.34", "0.5", "0.7")):
        shown = sample(b_registry, "tiergate_cache_semantic_cutoff", tenant="acme", bound="0.1", overlap=edge)
        assert shown == b.cutoffs("acme", 0.10)[g]
    point, upper = (sample(b_registry, "tiergate_cache_false_hit_rate", tenant="acme", bound="0.1", estimate=e)
                    for e in ("point", "upper95"))
    assert point <= upper <= 0.10


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
    """Evidence that everything above 0.95 is right: the cutoff of the top overlap region (where Q and PARA
    are: they share every content word) comes down to there."""
    sims = np.concatenate([np.linspace(0.95, 0.9999, 2000), np.linspace(0.80, 0.9499, 2000)])
    wrong = np.concatenate([np.zeros(2000, bool), np.ones(2000, bool)])
    cache.errbound.seed(tenant, sims, np.ones(len(sims)), wrong)
    return cache.errbound.cutoff(tenant, BOUNDED.max_false_hit_rate, 1.0)


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


async def test_a_shadow_check_serves_the_hit_and_learns_from_the_tier_answer_offered_after_it(bounded_cache):
    cache, reg, judge = bounded_cache
    certify(cache)
    await cache.store(chat(Q), "acme", BOUNDED, answer("Diversify."))
    shadow = dataclasses.replace(BOUNDED, verify_rate=1.0, verify_mode="shadow")
    res = await cache.check(chat(PARA), "acme", shadow)
    assert res.status == "hit-semantic" and res.reason == "verify"  # served, and to be checked
    assert res.hit.answer.text == "Diversify."
    judge.verdict = False
    await cache.store(chat(PARA), "acme", shadow, answer("Buy lottery tickets."), res.key)  # the tier's answer
    assert judge.calls == [(PARA, "Diversify.", "Buy lottery tickets.")]
    assert sample(reg, "tiergate_cache_verifications_total", tenant="acme", source="verify", result="wrong") == 1
    assert await cache.shared.entry_threshold(res.hit.entry_id) > res.hit.similarity  # found wrong: tightened


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
    assert hit.overlap == 1.0  # the label is counted in the hit's overlap region, besides the 2,000 seeded there
    assert cache.errbound.counts("acme")[2, region(hit.overlap)].sum() == 2001
