"""bench/cache/scale's report: the Redis 8 targets and the search-effort table come from the rows, nothing typed."""

from __future__ import annotations

from bench.cache.scale import render
from tiergate.cache.settings import CacheSettings


def _row(version: str, entries: int, p50: float, rss: int, first: float, sweep: list | None = None) -> dict:
    return {"entries": entries, "version": version, "source": "restored", "restore_s": 1.0,
            "redis": {"used_memory_mib": 10, "rss_mib": 12, "server_version": "8.2.3"},
            "gateway": {"first_semantic_hit_s": first, "ready_s": first, "gateway_rss_mib": rss},
            "no_embedding": {"p50_ms": p50, "p99_ms": 2 * p50}, "with_embedding": {"p50_ms": 7.0, "p99_ms": 9.0},
            "semantic_hit_rate": 1.0, "bypassed": 0, "lookups": 600, "redis_cpu_ms_per_lookup": 1.0,
            "index_load_s": 0.0, "hnsw_build_s": 0.0, "load_avg_1m": 0.5, "ef_sweep": sweep}


def test_targets_are_judged_at_the_largest_scale() -> None:
    ef = CacheSettings().vset_search_ef
    sweep = [{"ef": e, "mode": m, "recall_at_1": 1.0, "p50_ms": 1.0, "p99_ms": 2.0}
             for e in (32, ef) for m in ("NOTHREAD", "threaded")]
    rows = [_row("redis8", 10_000, 1.2, 200, 1.1), _row("redis8", 1_000_000, 2.4, 203, 1.3, sweep),
            _row("redis7", 1_000_000, 2.0, 900, 7.0)]
    text = "\n".join(render(rows))
    assert "lookup p50 <= 2 ms at 1,000,000 entries: 2.4 ms — **not met**" in text  # the 10k row does not count
    assert "gateway RSS independent of the entry count: 200 MiB / 203 MiB at 10,000 / 1,000,000 — **met**" in text
    assert "first semantic hit within 5 s of start: 1.1 s / 1.3 s — **met**" in text  # Redis 7's 7 s is not judged
    assert f"| 1,000,000 | {ef} (product) | 1.000 |" in text and "| 1,000,000 | 32 | 1.000 |" in text
    rows[1]["no_embedding"]["p50_ms"] = 1.9
    rows[1]["gateway"]["gateway_rss_mib"] = 400
    text = "\n".join(render(rows))
    assert "at 1,000,000 entries: 1.9 ms — **met**" in text and "entry count: 200 MiB / 400 MiB" in text
    assert "1,000,000 — **not met**" in text
    text = "\n".join(render([rows[0], rows[2]]))  # no Redis 8 row at 1M: the target is not judged met
    assert "no 1,000,000 row in this run (at 10,000: 1.2 ms) — **not met**" in text
