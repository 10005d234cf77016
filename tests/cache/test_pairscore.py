"""cache/pairscore: the bound score a cross-encoder verifier gives, and error-bounded rules deciding on it.

The decisions here use a stand-in scorer (the boundary: what the ONNX members would say); the real members,
trained by `tiergate cache train-verifier`, are in tests/integration/test_cache_verifier.py.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from tests.cache.helpers import RULE, SETTINGS, answer, chat, fresh_metrics, sample
from tiergate.cache import build_cache
from tiergate.cache.errbound import FLOOR
from tiergate.cache.pairscore import MANIFEST, Combination, PairScorer, VerifierError

pytestmark = pytest.mark.anyio

BOUNDED = dataclasses.replace(RULE, max_false_hit_rate=0.10, verify_rate=0.0)
Q, PARA = "How do I invest my money wisely?", "How can I invest my money wisely?"
EVEN = Combination(1.0, 1.0, 0.0, np.linspace(0.01, 1.0, 100))  # probabilities in equal shares of 1 %


def test_the_bound_score_is_the_probabilitys_share_of_the_training_candidates_on_the_bounds_axis() -> None:
    z = np.array([-10.0, 0.0, 10.0])  # probabilities ~0, 0.5, ~1
    got = EVEN.bound_scores(z, np.zeros(3))
    assert got[0] == pytest.approx(FLOOR)  # below every training candidate: the floor
    assert got[1] == pytest.approx(FLOOR + (1 - FLOOR) * 0.50)  # 50 of the 100 quantiles are at most 0.5
    assert FLOOR <= got[2] < 1.0  # above them all: still inside the bound's last cell
    cos = np.linspace(-3, 3, 50)
    assert np.all(np.diff(EVEN.bound_scores(cos, np.zeros(50))) >= 0)  # rises with the cosine
    assert np.all(np.diff(EVEN.bound_scores(np.zeros(50), cos)) >= 0)  # and with the logit


def test_a_manifest_round_trips_and_bad_quantiles_are_refused() -> None:
    assert Combination.from_json(EVEN.to_json()).bound_scores(np.array([0.3]), np.array([0.1])) == \
        pytest.approx(EVEN.bound_scores(np.array([0.3]), np.array([0.1])))
    with pytest.raises(ValueError, match="ascending"):
        Combination.from_json(EVEN.to_json() | {"quantiles": [0.9, 0.1]})


def test_a_folder_that_is_not_a_verifier_says_which_file_and_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(VerifierError, match="train-verifier"):
        PairScorer.load(tmp_path / "absent")
    (tmp_path / MANIFEST).write_text("{not json")
    with pytest.raises(VerifierError, match=f"{MANIFEST}: not a verifier manifest"):
        PairScorer.load(tmp_path)
    (tmp_path / MANIFEST).write_text(json.dumps({"members": ["member-0.onnx"], "max_length": 96,
                                                 "combination": EVEN.to_json()}))
    with pytest.raises(VerifierError, match="member member-0.onnx is missing"):
        PairScorer.load(tmp_path)


class StandIn:
    """What the members would score a candidate: a value the test sets (or an error)."""

    axis = "vstandin"

    def __init__(self) -> None:
        self.value: float | Exception = 0.99
        self.calls: list[tuple[float, str, str]] = []

    async def bound_score(self, cosine: float, cached: str, asked: str) -> float:
        self.calls.append((cosine, cached, asked))
        if isinstance(self.value, Exception):
            raise self.value
        return self.value

    def close(self) -> None:
        pass


@pytest.fixture
async def verified_cache(onnx_embedder):
    metrics, registry = fresh_metrics()
    scorer = StandIn()
    cache = build_cache(None, None, embedder=onnx_embedder, metrics=metrics, settings=SETTINGS,
                        pair_scorer=scorer)  # type: ignore[arg-type]
    # Evidence on the bound score's axis: everything from 0.95 up was right, everything below wrong.
    sims = np.concatenate([np.linspace(0.95, 0.9999, 2000), np.linspace(0.80, 0.9499, 2000)])
    cache.errbound.seed("acme@vstandin", sims, np.ones(len(sims)), np.arange(4000) >= 2000)
    await cache.start()
    await cache.store(chat(Q), "acme", BOUNDED, answer("Diversify."))
    yield cache, scorer, registry
    await cache.stop()


async def test_a_bounded_rule_decides_on_the_verifiers_score_and_the_header_keeps_the_cosine(verified_cache):
    cache, scorer, registry = verified_cache
    assert 0.85 < cache.errbound.cutoff("acme@vstandin", 0.10, 1.0) <= 0.95  # what the evidence certifies
    scorer.value = 0.99
    hit = await cache.check(chat(PARA), "acme", BOUNDED)
    assert hit.status == "hit-semantic"
    assert hit.hit.bound_score == 0.99 and 0.95 < hit.hit.similarity < 0.99  # the cosine, for the header
    assert scorer.calls == [(pytest.approx(hit.hit.similarity, abs=1e-4), Q, PARA)]  # cached, then asked
    scorer.value = 0.85  # the same cosine, but the verifier doubts it: below the certified cutoff
    assert (await cache.check(chat(PARA), "acme", BOUNDED)).status == "miss"
    unbounded = await cache.check(chat(PARA), "acme", RULE)  # a rule without a bound never asks the verifier
    assert unbounded.status == "hit-semantic" and unbounded.hit.bound_score is None and len(scorer.calls) == 2
    assert sample(registry, "tiergate_cache_verifier_seconds_count") == 2


async def test_feedback_raises_the_entrys_threshold_above_the_score_the_bound_decided_on(verified_cache):
    cache, scorer, _ = verified_cache
    scorer.value = 0.96
    hit = (await cache.check(chat(PARA), "acme", BOUNDED)).hit
    await cache.served("req-1", "acme", hit)
    done = await cache.feedback("acme", "req-1")
    assert 0.96 < done.threshold < hit.similarity  # above the bound score, not the cosine (0.978)


async def test_a_verifier_that_fails_is_a_bypass_never_an_error_to_the_client(verified_cache):
    cache, scorer, registry = verified_cache
    scorer.value = RuntimeError("onnxruntime failed")
    res = await cache.check(chat(PARA), "acme", BOUNDED)
    assert res.status == "bypass" and res.hit is None
    assert sample(registry, "tiergate_cache_errors_total", op="lookup") == 1
    assert (await cache.check(chat(Q), "acme", BOUNDED)).status == "hit-exact"  # exact hits need no verifier


async def test_evidence_counted_on_the_cosine_does_not_certify_the_verifiers_scores(onnx_embedder):
    """The two axes mean different things: a tenant's cosine evidence (seeded before the verifier was switched
    on) leaves the verifier's axis with no cutoff, and what is learnt there stays there, entry thresholds too."""
    scorer = StandIn()
    cache = build_cache(None, None, embedder=onnx_embedder, settings=SETTINGS, pair_scorer=scorer)  # type: ignore[arg-type]
    sims = np.concatenate([np.linspace(0.95, 0.9999, 2000), np.linspace(0.80, 0.9499, 2000)])
    cache.errbound.seed("acme", sims, np.ones(len(sims)), np.arange(4000) >= 2000)  # the cosine's evidence
    await cache.start()
    try:
        await cache.store(chat(Q), "acme", BOUNDED, answer("Diversify."))
        assert (await cache.check(chat(PARA), "acme", BOUNDED)).status == "miss"  # no cutoff on this axis yet
        cache.errbound.seed("acme@vstandin", sims, np.ones(len(sims)), np.arange(4000) >= 2000)
        hit = (await cache.check(chat(PARA), "acme", BOUNDED)).hit
        assert hit is not None and hit.bound_score == 0.99
        await cache.served("req-1", "acme", hit)
        done = await cache.feedback("acme", "req-1")
        assert await cache.shared.entry_threshold(f"{hit.entry_id}@vstandin") == done.threshold > 0.99
        assert await cache.shared.entry_threshold(hit.entry_id) is None  # the cosine's own is untouched
    finally:
        await cache.stop()
