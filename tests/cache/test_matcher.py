"""cache/matcher: the lookup decision. An exact entry is served only to its own tenant and within the request's
token budget; a miss keeps its embedding for the store that follows; pairs are scored by the same rules."""

from __future__ import annotations

import time

import pytest

from tests.cache.helpers import RULE, SETTINGS, answer, chat, fresh_metrics, sample
from tiergate.cache import build_cache
from tiergate.cache.keys import request_key
from tiergate.cache.types import CacheEntry

pytestmark = pytest.mark.anyio


def _entry(key_of: str, tenant: str, *, stored_for: str | None = None, max_tokens: int | None = None) -> CacheEntry:
    """The entry a request for `key_of` by `tenant` would find, stored for `stored_for`'s tenant and namespace."""
    key, owner = request_key(chat(key_of), tenant), request_key(chat(key_of), stored_for or tenant)
    now = time.time()
    return CacheEntry(id=key.entry_id, tenant=owner.tenant, namespace=owner.namespace, text=key.text,
                      answer=answer("Diversify.", completion_tokens=50), max_tokens=max_tokens, created=now,
                      expires_at=now + 60)


async def test_an_exact_entry_is_served_only_to_its_tenant() -> None:
    metrics, reg = fresh_metrics()
    cache = build_cache(None, None, settings=SETTINGS, metrics=metrics)
    key = request_key(chat("How do I invest?"), "acme")
    await cache.backend.put(_entry("How do I invest?", "acme"), None)
    found = await cache.matcher.find(key, RULE)
    assert found.status == "hit-exact" and found.hit is not None and found.hit.answer.text == "Diversify."
    await cache.backend.put(_entry("How do I invest?", "acme", stored_for="other"), None)  # the index lied
    assert (await cache.matcher.find(key, RULE)).status == "miss"
    assert sample(reg, "tiergate_cache_errors_total", op="foreign_entry") == 1


async def test_an_answer_longer_than_the_budget_is_not_served() -> None:
    cache = build_cache(None, None, settings=SETTINGS, metrics=fresh_metrics()[0])
    await cache.backend.put(_entry("How do I invest?", "acme", max_tokens=100), None)
    tight = request_key(chat("How do I invest?", max_tokens=10), "acme")
    assert (await cache.matcher.find(tight, RULE)).status == "miss"


async def test_a_miss_keeps_its_embedding_for_the_store_once(onnx_embedder) -> None:
    cache = build_cache(None, None, embedder=onnx_embedder, settings=SETTINGS, metrics=fresh_metrics()[0])
    await cache.start()
    try:
        key = request_key(chat("How do I bake bread?"), "acme")
        assert (await cache.matcher.find(key, RULE)).status == "miss"
        vec = cache.matcher.take_vector(key.entry_id)
        assert vec is not None and vec.values.shape == (384,)
        assert cache.matcher.take_vector(key.entry_id) is None
        await cache.matcher.find(key, RULE)
        cache.matcher.forget()
        assert cache.matcher.take_vector(key.entry_id) is None
    finally:
        await cache.stop()


async def test_pairs_without_an_embedder_match_only_exactly() -> None:
    cache = build_cache(None, None, settings=SETTINGS, metrics=fresh_metrics()[0])
    same, other = await cache.matcher.score_many([("Hi there", "Hi there"), ("a", "b")], RULE)
    assert (same.hit, same.similarity) == (True, 1.0)
    assert (other.hit, other.reason) == (False, "semantic_off")
