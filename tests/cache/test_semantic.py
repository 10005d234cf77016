"""SemanticCache on the in-process store with the real ONNX embedder."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from tests.cache.helpers import RULE, SETTINGS, answer, chat, completion, fresh_metrics, sample
from tiergate.cache import SemanticCache, build_cache
from tiergate.cache.index import VectorIndex
from tiergate.cache.store import MemoryStore, StoreUnavailable
from tiergate.core.wire import ChatRequest, ContentPart, Message

pytestmark = pytest.mark.anyio


@pytest.fixture
async def cache_and_registry(onnx_embedder):
    metrics, registry = fresh_metrics()
    cache = build_cache(None, None, embedder=onnx_embedder, metrics=metrics, settings=dataclasses.replace(SETTINGS, max_entries=50))
    await cache.start()
    yield cache, registry
    await cache.stop()


async def test_exact_then_semantic_hit(cache_and_registry) -> None:
    cache, reg = cache_and_registry
    q = chat("How do I invest my money wisely?")
    assert (await cache.check(q, "t", RULE)).status == "miss"
    assert await cache.store(q, "t", RULE, answer("Diversify."))
    exact = await cache.check(q, "t", RULE)
    assert exact.status == "hit-exact" and exact.hit.similarity == 1.0
    semantic = await cache.check(chat("How can I invest my money wisely?"), "t", RULE)
    assert semantic.status == "hit-semantic" and semantic.hit.answer.text == "Diversify."
    assert semantic.hit.entry_id == exact.hit.entry_id
    assert sample(reg, "tiergate_cache_stores_total", result="stored") == 1
    assert sample(reg, "tiergate_cache_embedding_seconds_count") >= 1


async def test_guard_vetoes_a_close_but_different_question(cache_and_registry) -> None:
    cache, reg = cache_and_registry
    await cache.store(chat("How do I convert a string to an integer in JavaScript?"), "t", RULE, answer("parseInt"))
    res = await cache.check(chat("How do I convert an integer to a string in JavaScript?"), "t", RULE)
    assert res.status == "miss"
    assert sample(reg, "tiergate_cache_vetoes_total", guard="order") == 1


async def test_threshold_comes_from_the_rule(cache_and_registry) -> None:
    cache, _ = cache_and_registry
    await cache.store(chat("How do I invest my money wisely?"), "t", RULE, answer("Diversify."))
    strict = dataclasses.replace(RULE, threshold=0.999)
    assert (await cache.check(chat("How can I invest my money wisely?"), "t", strict)).status == "miss"
    no_semantic = dataclasses.replace(RULE, semantic=False)
    assert (await cache.check(chat("How can I invest my money wisely?"), "t", no_semantic)).status == "miss"
    assert (await cache.check(chat("How do I invest my money wisely?"), "t", no_semantic)).status == "hit-exact"


async def test_context_and_tenant_separate_answers(cache_and_registry) -> None:
    cache, _ = cache_and_registry
    await cache.store(chat("What is Rust?", system="Answer in French."), "t", RULE, answer("Un langage."))
    assert await cache.lookup(chat("What is Rust?"), "t", RULE) is None
    assert await cache.lookup(chat("What is Rust?", system="Answer in French."), "other", RULE) is None
    hit = await cache.lookup(chat("What is Rust ?", system="Answer in French."), "t", RULE)
    assert hit is not None and hit.answer.text == "Un langage."


async def test_uncacheable_requests_bypass_and_are_not_stored(cache_and_registry) -> None:
    cache, reg = cache_and_registry
    hot = chat("Write a poem", temperature=None)  # no temperature: OpenAI's 1.0
    assert not cache.accepts(hot, RULE)
    assert (await cache.check(hot, "t", RULE)) .status == "bypass"
    assert not await cache.store(hot, "t", RULE, answer("roses"))
    assert sample(reg, "tiergate_cache_skipped_total", reason="temperature") == 1
    assert not await cache.store(chat("hi"), "t", RULE, answer("cut", finish_reason="error"))
    assert len(cache.index) == 0


async def test_budget_too_small_for_the_stored_answer_misses(cache_and_registry) -> None:
    cache, _ = cache_and_registry
    await cache.store(chat("Explain TCP", max_tokens=500), "t", RULE, answer("long", completion_tokens=300))
    assert await cache.lookup(chat("Explain TCP", max_tokens=100), "t", RULE) is None
    assert await cache.lookup(chat("Explain TCP", max_tokens=400), "t", RULE) is not None


async def test_huge_prompts_fall_back_to_exact_matching(cache_and_registry) -> None:
    cache, reg = cache_and_registry
    long_q = "Summarise this: " + "lorem ipsum dolor sit amet " * 2000
    await cache.store(chat(long_q), "t", RULE, answer("summary"))
    assert (await cache.check(chat(long_q), "t", RULE)).status == "hit-exact"
    assert (await cache.check(chat(long_q + " please"), "t", RULE)).status == "miss"
    assert sample(reg, "tiergate_cache_semantic_skipped_total", reason="too_long") >= 1
    # Over the model's window but under the character cap: truncated embeddings are not trusted either.
    mid = "word " * 600
    await cache.store(chat(mid), "t", RULE, answer("m"))
    assert (await cache.check(chat(mid + "extra"), "t", RULE)).status == "miss"


async def test_an_entry_past_the_size_bound_is_not_stored(cache_and_registry) -> None:
    """A 70k-character prompt, or answer, is not cached: one tenant's huge requests cannot fill the store."""
    cache, reg = cache_and_registry
    huge_q, huge_a = "Repeat: " + "x" * 70_000, "y" * 70_000
    assert not await cache.store(chat(huge_q), "t", RULE, answer("short"))
    assert not await cache.store(chat("a short question"), "t", RULE, answer(huge_a))
    assert (await cache.check(chat(huge_q), "t", RULE)).status == "miss"
    assert sample(reg, "tiergate_cache_stores_total", result="skipped") == 2
    assert await cache.store(chat("a short question"), "t", RULE, answer("a short answer"))


@pytest.mark.parametrize("content", ["", "   ", "\x00\x01\xff", "\ud800\udc00 lone", "é" * 3, "🙂🙃"])
async def test_odd_content_never_raises(cache_and_registry, content) -> None:
    cache, _ = cache_and_registry
    q = chat(content)
    res = await cache.check(q, "t\ud800", RULE)
    assert res.status in ("miss", "hit-exact")
    await cache.store(q, "t\ud800", RULE, answer("x"))
    assert (await cache.check(q, "t\ud800", RULE)).status == "hit-exact"


async def test_image_and_completion_requests(cache_and_registry) -> None:
    cache, _ = cache_and_registry
    img = ChatRequest(model="m", temperature=0, messages=[Message(role="user", content=[
        ContentPart(type="text", text="what is this"), ContentPart(type="image_url", image_url={"url": "x"})])])
    await cache.store(img, "t", RULE, answer("a cat"))
    assert (await cache.check(img, "t", RULE)).status == "hit-exact"  # exact only: no semantic on images
    await cache.store(completion("The capital of France is"), "t", RULE, answer(" Paris"))
    assert (await cache.check(completion(["The capital of France is"]), "t", RULE)).status == "hit-exact"


async def test_size_bound_and_invalidation_in_process(cache_and_registry) -> None:
    cache, reg = cache_and_registry
    for i in range(55):
        await cache.store(chat(f"Question number {i}?"), "t", dataclasses.replace(RULE, ttl_s=100 + i), answer())
    assert len(cache.index) == 50 and sample(reg, "tiergate_cache_evictions_total") == 5
    assert await cache.lookup(chat("Question number 0?"), "t", RULE) is None
    assert await cache.lookup(chat("Question number 54?"), "t", RULE) is not None
    await cache.store(chat("Other tenant?"), "u", RULE, answer())  # evicts question 5, the next to expire
    assert await cache.lookup(chat("Question number 5?"), "t", RULE) is None
    assert await cache.invalidate(tenant="u") == 1
    assert await cache.invalidate() == 49 and len(cache.index) == 0


async def test_score_pairs_helper(cache_and_registry) -> None:
    cache, _ = cache_and_registry
    same = await cache.score("How do I invest my money wisely?", "How can I invest my money wisely?", RULE)
    assert same.hit and same.similarity >= RULE.threshold
    years = await cache.score("What happened in 2002?", "What happened in 1992?", dataclasses.replace(RULE, threshold=0.5))
    assert not years.hit and years.reason == "numbers"
    off = await cache.score("a", "b", dataclasses.replace(RULE, enabled=False))
    assert not off.hit and off.reason == "disabled"


class _BrokenStore:
    """A store whose every call fails, as a down Redis does."""

    in_process = False
    kind = "broken"

    def __init__(self, index) -> None:
        self.index = index

    def describe(self) -> dict:
        return {"store": self.kind}

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def available(self) -> bool:
        return True

    async def get_many(self, namespace, ids):
        raise StoreUnavailable("down")

    async def nearest(self, namespace, vector, k, min_sim):
        raise StoreUnavailable("down")

    async def put(self, entry, vector):
        raise RuntimeError("a bug")

    async def delete(self, entry_id, namespace=None):
        raise StoreUnavailable("down")

    delete_tenant = delete_all = delete


async def test_store_failures_become_bypass_not_exceptions(onnx_embedder) -> None:
    metrics, reg = fresh_metrics()
    cache = SemanticCache(_BrokenStore(VectorIndex(onnx_embedder.dim)), None, metrics=metrics, settings=SETTINGS)
    res = await cache.check(chat("hi"), "t", RULE)
    assert res.status == "bypass" and res.reason == "store_unavailable"
    assert await cache.store(chat("hi"), "t", RULE, answer()) is False
    assert sample(reg, "tiergate_cache_errors_total", op="store") == 1
    with pytest.raises(StoreUnavailable):  # admin operations say that they did not happen
        await cache.invalidate(tenant="t")


async def test_exact_only_cache_without_embedder() -> None:
    metrics, _ = fresh_metrics()
    cache = build_cache(None, None, metrics=metrics, settings=SETTINGS)
    await cache.start()
    try:
        await cache.store(chat("What is Rust?"), "t", RULE, answer("A language."))
        assert (await cache.check(chat("What is Rust?"), "t", RULE)).status == "hit-exact"
        assert (await cache.check(chat("What's Rust?"), "t", RULE)).status == "miss"
    finally:
        await cache.stop()


async def _never(gave_up: list[str], what: str) -> None:
    """Wait for ever (for a result that never comes); record being given up on."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        gave_up.append(what)
        raise


class _SlowStore(_BrokenStore):
    """A store that never answers (Redis stuck behind a slow command): only the lookup's own timeout ends it."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.gave_up: list[str] = []

    async def get_many(self, namespace, ids):
        await _never(self.gave_up, "get_many")


class _SlowBatcher:
    """An embedder stuck behind a batch that never ends."""

    def __init__(self) -> None:
        self.gave_up: list[str] = []

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def embed(self, text):
        await _never(self.gave_up, "embed")


async def test_a_slow_lookup_is_bypassed_within_the_lookup_timeout(onnx_embedder) -> None:
    """Remote reads and embedding are bounded by lookup_timeout_s; only an in-process exact read goes untimed."""
    # The slow parts never answer, so a lookup that returns at all was ended by its own timeout (were the bound
    # gone, the test would wait until pytest-timeout fails it); no wall-clock threshold needed.
    settings = dataclasses.replace(SETTINGS, lookup_timeout_s=0.1)
    store, batcher = _SlowStore(VectorIndex(onnx_embedder.dim)), _SlowBatcher()
    slow_store = SemanticCache(store, None, settings=settings, metrics=fresh_metrics()[0])
    slow_embedder = SemanticCache(MemoryStore(VectorIndex(onnx_embedder.dim), max_entries=10), batcher,
                                  settings=settings, metrics=fresh_metrics()[0])
    for cache, part in ((slow_store, store), (slow_embedder, batcher)):
        res = await cache.check(chat("How do I invest my money wisely?"), "t", RULE)
        assert (res.status, res.reason) == ("bypass", "timeout")
        assert part.gave_up  # the lookup stopped waiting for it
    exact_only = await slow_embedder.check(chat("How do I invest my money wisely?"), "t",
                                           dataclasses.replace(RULE, semantic=False))
    assert exact_only.status == "miss"


async def test_one_tenants_flood_evicts_its_own_entries_not_its_peers(cache_and_registry) -> None:
    cache, reg = cache_and_registry
    peer = [f"What does the peer ask, number {i}?" for i in range(10)]
    for q in peer:  # the peer's entries are the oldest, and would go first under a plain oldest-first bound
        await cache.store(chat(q), "peer", RULE, answer())
    for i in range(200):
        await cache.store(chat(f"Flood question {i}?"), "flood", RULE, answer())
    assert len(cache.index) == 50 and sample(reg, "tiergate_cache_evictions_total") == 160
    for q in peer:
        assert (await cache.check(chat(q), "peer", RULE)).status == "hit-exact"
    assert await cache.lookup(chat("Flood question 199?"), "flood", RULE) is not None
    assert await cache.lookup(chat("Flood question 0?"), "flood", RULE) is None
