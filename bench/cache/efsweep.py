"""Redis 8's search effort against recall, at each scale: what `CacheSettings.vset_search_ef` is chosen from.

For the scale's queries (each a stored synthetic vector plus a little noise, cosine ~0.997 to it), one VSIM per
query at each EF, on Redis's main thread (`NOTHREAD`, as inside the product's search script) and threaded (Redis
starts a thread per query): recall@1 (the stored vector the query was made from comes first) and the client-side
p50 / p99. Called by bench/cache/scale.py's lookup process, on the same server and queries.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import redis

__all__ = ["EFS", "sweep"]

EFS = (32, 40, 50, 100, 200)


def sweep(url: str, key: str, ids: list[str], queries: np.ndarray, efs: tuple[int, ...] = EFS) -> list[dict[str, Any]]:
    """`ids[i]` is the element query i was made from."""
    client = redis.Redis.from_url(url)
    out = []
    try:
        for ef in efs:
            for mode in ("NOTHREAD", "threaded"):
                extra = ["NOTHREAD"] if mode == "NOTHREAD" else []
                lat, right = [], 0
                for eid, q in zip(ids, queries, strict=True):
                    blob = np.asarray(q, "<f4").tobytes()
                    t = time.perf_counter()
                    found = client.execute_command("VSIM", key, "FP32", blob, "COUNT", 4, "EF", ef, *extra)
                    lat.append(time.perf_counter() - t)
                    right += bool(found) and found[0].decode() == eid
                out.append({"ef": ef, "mode": mode, "recall_at_1": round(right / len(ids), 4),
                            "p50_ms": round(float(np.median(lat)) * 1000, 3),
                            "p99_ms": round(float(np.percentile(lat, 99)) * 1000, 3)})
    finally:
        client.close()
    return out
