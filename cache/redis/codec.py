"""How one cache entry is written to, and read back from, a Redis hash (both Redis layouts).

Fields: `t` tenant, `ns` namespace, `x` the matched text, `a` the answer (msgspec JSON), `m` the max_tokens budget
("" for none), `c` created and `e` expires (unix seconds, repr floats), and the vector: `v` float32 (the Redis 7
layout, whose followers rebuild their index from it) or `h` float16 (the Redis 8 layout: only used to re-score
a candidate exactly, 768 bytes instead of 1,536 for 384 dimensions).

Reading never raises: a hash that is missing a field, holds the wrong type or a vector of another dimension is
logged once (`cache_corrupt_entry`), counted (`tiergate_cache_errors_total{op="decode"}`) and read as absent, so
it can only ever be a miss.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import msgspec
import numpy as np
import structlog

from tiergate.cache.metrics import CacheMetrics
from tiergate.cache.types import CachedAnswer, CacheEntry

__all__ = ["decode_entry", "entry_fields", "glob_escape"]

log = structlog.get_logger("tiergate.cache.redis")

_answer_decoder = msgspec.json.Decoder(CachedAnswer)
_DECODE_ERRORS = (KeyError, ValueError, TypeError, AttributeError, UnicodeDecodeError, msgspec.DecodeError,
                  msgspec.ValidationError)
_logged: OrderedDict[str, None] = OrderedDict()  # entries already reported as corrupt (bounded)


def glob_escape(text: str) -> str:
    """`text` matched literally in a SCAN MATCH pattern."""
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


def entry_fields(entry: CacheEntry, vector: np.ndarray | None, *, half: bool) -> list[Any]:
    """The hash fields of an entry, flat (`HSET key f1 v1 f2 v2 ...`)."""
    if vector is None:
        vec_field, vec = ("h" if half else "v"), b""
    elif half:
        vec_field, vec = "h", np.asarray(vector, "<f2").tobytes()
    else:
        vec_field, vec = "v", np.asarray(vector, "<f4").tobytes()
    return ["t", entry.tenant, "ns", entry.namespace, "x", entry.text, "a", msgspec.json.encode(entry.answer),
            vec_field, vec, "m", "" if entry.max_tokens is None else str(entry.max_tokens),
            "c", repr(entry.created), "e", repr(entry.expires_at)]


def decode_entry(entry_id: str, row: Any, metrics: CacheMetrics, dim: int | None = None) -> CacheEntry | None:
    """The entry in a hash read by HGETALL (`row`: a dict, or the exception a pipeline returned for that key);
    None when it is gone or unreadable. `dim`: the embedder's dimension; a stored vector of another size is
    dropped (the entry stays an exact-match entry)."""
    if not row:
        return None
    try:
        if isinstance(row, BaseException):
            raise TypeError(str(row))  # e.g. WRONGTYPE: the key is not a hash
        m = row.get(b"m") or b""
        emb = row.get(b"v") or b""
        half = row.get(b"h") or b""
        if half:
            if len(half) % 2:
                raise ValueError("a float16 vector of an odd number of bytes")
            emb = np.frombuffer(half, "<f2").astype("<f4").tobytes()
        if emb and (len(emb) % 4 or (dim is not None and len(emb) != 4 * dim)):
            emb = b""  # another embedder's vector: not comparable with ours
        return CacheEntry(
            id=entry_id,
            tenant=row[b"t"].decode(),
            namespace=row[b"ns"].decode(),
            text=row[b"x"].decode(),
            answer=_answer_decoder.decode(row[b"a"]),
            embedding=emb,
            max_tokens=int(m) if m else None,
            created=float(row.get(b"c") or 0),
            expires_at=float(row.get(b"e") or 0),
        )
    except _DECODE_ERRORS as exc:
        metrics.errors.labels("decode").inc()
        if entry_id not in _logged:
            _logged[entry_id] = None
            if len(_logged) > 1024:
                _logged.popitem(last=False)
            log.warning("cache_corrupt_entry", entry=entry_id, error=repr(exc)[:200],
                        effect="read as a miss; it leaves with its TTL or an invalidation")
        return None
