"""A cache entry as a Redis hash: written by HSET and read back by HGETALL on real servers (Redis 7 and 8), and
every unreadable hash read as absent, counted and logged once."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import numpy as np
import pytest
import redis
from structlog.testing import capture_logs

from tests.cache.helpers import answer, fresh_metrics, sample
from tiergate.cache.redis.codec import decode_entry, entry_fields, glob_escape
from tiergate.cache.types import CacheEntry

DIM = 8


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def unit(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def an_entry(entry_id: str = "t1-abc", **changes: object) -> CacheEntry:
    fields = {"id": entry_id, "tenant": "acme", "namespace": "ns1", "text": "what is a black hole",
              "answer": answer("A region of spacetime…"), "max_tokens": 64, "created": 1700000000.125,
              "expires_at": 1700003600.5, **changes}
    return CacheEntry(**fields)  # type: ignore[arg-type]


def written(r: redis.Redis, entry: CacheEntry, vector: np.ndarray | None, *, half: bool) -> dict:
    r.delete(entry.id)
    r.hset(entry.id, mapping=dict(zip(*[iter(entry_fields(entry, vector, half=half))] * 2, strict=True)))
    return r.hgetall(entry.id)


def test_an_entry_with_a_float32_vector_comes_back_exactly(r) -> None:
    metrics, registry = fresh_metrics()
    entry, vector = an_entry(), unit(1)
    row = written(r, entry, vector, half=False)
    assert b"v" in row and b"h" not in row
    got = decode_entry(entry.id, row, metrics, dim=DIM)
    assert got == CacheEntry(**{**{f: getattr(entry, f) for f in entry.__struct_fields__},
                                "embedding": vector.astype("<f4").tobytes()})
    assert sample(registry, "tiergate_cache_errors_total", op="decode") == 0


def test_a_float16_vector_takes_half_the_bytes_and_comes_back_as_float32_within_half_precision(r) -> None:
    metrics, _ = fresh_metrics()
    entry, vector = an_entry(), unit(2)
    row = written(r, entry, vector, half=True)
    assert len(row[b"h"]) == 2 * DIM and b"v" not in row
    got = decode_entry(entry.id, row, metrics, dim=DIM)
    assert got is not None
    back = np.frombuffer(got.embedding, "<f4")
    assert back.shape == (DIM,)
    np.testing.assert_allclose(back, vector, atol=1e-3)
    assert got.answer == entry.answer and got.text == entry.text


def test_an_entry_without_a_vector_or_a_budget_is_an_exact_match_entry(r) -> None:
    metrics, _ = fresh_metrics()
    for half in (False, True):
        entry = an_entry(max_tokens=None)
        got = decode_entry(entry.id, written(r, entry, None, half=half), metrics, dim=DIM)
        assert got is not None and got.embedding == b"" and got.max_tokens is None


def test_a_vector_of_another_dimension_is_dropped_but_the_entry_stays(r) -> None:
    metrics, registry = fresh_metrics()
    entry = an_entry()
    for half in (False, True):
        row = written(r, entry, unit(3), half=half)
        got = decode_entry(entry.id, row, metrics, dim=DIM * 2)
        assert got is not None and got.embedding == b"" and got.answer == entry.answer
        assert decode_entry(entry.id, row, metrics).embedding != b""  # no dimension given: kept
    assert sample(registry, "tiergate_cache_errors_total", op="decode") == 0


def test_a_missing_hash_is_simply_absent(r) -> None:
    metrics, registry = fresh_metrics()
    assert decode_entry("gone", r.hgetall("gone"), metrics) is None
    assert decode_entry("gone", None, metrics) is None
    assert sample(registry, "tiergate_cache_errors_total", op="decode") == 0


@pytest.mark.parametrize("damage", [
    pytest.param(lambda r, k: r.hdel(k, "a"), id="no-answer"),
    pytest.param(lambda r, k: r.hdel(k, "t"), id="no-tenant"),
    pytest.param(lambda r, k: r.hset(k, "a", b'{"kind": "chat"}'), id="answer-missing-fields"),
    pytest.param(lambda r, k: r.hset(k, "a", b"\xff not json"), id="answer-not-json"),
    pytest.param(lambda r, k: r.hset(k, "m", "lots"), id="budget-not-a-number"),
    pytest.param(lambda r, k: r.hset(k, "e", "soon"), id="expiry-not-a-number"),
    pytest.param(lambda r, k: r.hset(k, "x", b"\xff\xfe"), id="text-not-utf8"),
    pytest.param(lambda r, k: r.hset(k, "h", b"\x00\x01\x02"), id="odd-float16-bytes"),
])
def test_a_damaged_hash_reads_as_absent_and_is_counted(r, damage) -> None:
    metrics, registry = fresh_metrics()
    entry = an_entry(f"damaged-{uuid.uuid4().hex}")  # each id is logged once per process
    written(r, entry, unit(4), half=False)
    damage(r, entry.id)
    with capture_logs() as logs:
        assert decode_entry(entry.id, r.hgetall(entry.id), metrics, dim=DIM) is None
    assert sample(registry, "tiergate_cache_errors_total", op="decode") == 1
    assert [e["event"] for e in logs] == ["cache_corrupt_entry"] and logs[0]["entry"] == entry.id


def test_a_float32_vector_of_a_partial_float_is_dropped_not_fatal(r) -> None:
    metrics, registry = fresh_metrics()
    entry = an_entry()
    written(r, entry, unit(5), half=False)
    r.hset(entry.id, "v", b"\x00" * 7)
    got = decode_entry(entry.id, r.hgetall(entry.id), metrics)
    assert got is not None and got.embedding == b""


def test_a_key_of_another_type_reads_as_absent_and_each_entry_is_logged_once(r) -> None:
    metrics, registry = fresh_metrics()
    k = f"t1-{uuid.uuid4().hex}"
    r.set(k, "not a hash")
    pipe = r.pipeline(transaction=False)
    pipe.hgetall(k)
    [row] = pipe.execute(raise_on_error=False)
    assert isinstance(row, redis.ResponseError)  # WRONGTYPE, as the stores' pipelines hand it over
    with capture_logs() as logs:
        for _ in range(3):
            assert decode_entry(k, row, metrics) is None
    assert sample(registry, "tiergate_cache_errors_total", op="decode") == 3
    assert [e["event"] for e in logs] == ["cache_corrupt_entry"]
    assert "WRONGTYPE" in logs[0]["error"]


def test_glob_escape_matches_exactly_the_literal_key_in_scan(r) -> None:
    tricky = "ten*ant?[x]\\y"
    keys = [f"p:{tricky}:1", f"p:{tricky}:2", "p:tenXant?[x]\\y:1", "p:ten*antZ[x]\\y:1", "p:ten*ant?x\\y:1",
            "p:ten*ant?[x]y:1"]
    for k in keys:
        r.set(k, 1)
    found = sorted(k.decode() for k in r.scan_iter(match=f"p:{glob_escape(tricky)}:*"))
    assert found == [f"p:{tricky}:1", f"p:{tricky}:2"]
    assert glob_escape("plain-text_1") == "plain-text_1"
