"""Semantic cache benchmark: accuracy on labelled pairs, lookup latency at scale, embedding speed, memory, and
hit vs miss latency end to end through a real gateway.

    .venv/bin/python -m bench.cache [--scales 10k,100k,1m] [--write-docs]
    .venv/bin/python -m bench.cache --only e2e [--e2e-requests 300] [--e2e-stores memory,redis] [--write-docs]

`--only accuracy,scales,e2e` runs some parts and keeps the others' last results (bench/results/cache.json), so
`--write-docs` always writes the whole section.

One run prints, side by side:
- precision / recall on the held-out half of ../shared/data/cache/qqp_pairs_dev.jsonl for tiergate's shipped
  settings (calibrated threshold + guards) and for the plain "cosine >= 0.8" rule, with the same embedder;
- `SemanticCache.check()` latency p50/p99 without embedding (the vector is given: index search, Redis reads,
  re-scoring, guards) and with embedding (a real ~20-word prompt through the batcher), at 10k and 100k
  entries in a real redis-server and 1M entries in the in-process store (synthetic low-rank vectors);
- embedding p50 for a ~20-word prompt on one thread;
- peak RSS of each scale's process (each scale runs in its own child process) and of redis-server;
- end to end (bench/cache/e2e.py): `tiergate serve` with the exported embedder, in-process store and Redis, in front
  of the instant upstream with a fixed generation time; p50/p99 of misses, exact hits and semantic hits (JSON and
  SSE), the `x-tiergate-cache` header tally, peak RSS of gateway, upstream and redis-server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.cache.e2e import render as e2e_render
from bench.cache.e2e import run as run_e2e
from bench.cache.e2e import wait_redis as _wait_redis
from bench.procs import free_port, peak_rss_mib
from bench.report import write_section

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "benchmarks.md"
HEADING = "## Semantic cache (bench/cache)"
SCALES = {"10k": 10_000, "30k": 30_000, "100k": 100_000, "1m": 1_000_000}
PROMPT = ("Can you explain in simple terms how a neural network learns from the examples it sees during "
          "training and why?")
QUERIES = 400


# -- accuracy -------------------------------------------------------------------------------------------------
def accuracy() -> dict[str, Any]:
    from bench.cache.calibrate import score, vetoes
    from bench.cache.pairs import load_pairs, split
    from cache.settings import DEFAULT_GUARDS, DEFAULT_THRESHOLD

    pairs = load_pairs()
    _, held = split(len(pairs.a))
    hp = pairs.take(held)
    cos, dup = hp.cosine, hp.duplicate
    per_guard = vetoes(hp)
    vetoed = np.zeros(len(held), bool)
    for g in DEFAULT_GUARDS:
        vetoed |= per_guard[g]
    rows = {
        f"tiergate (cos >= {DEFAULT_THRESHOLD} + guards)": score((cos >= DEFAULT_THRESHOLD) & ~vetoed, dup),
        f"cosine >= {DEFAULT_THRESHOLD} alone (no guards)": score(cos >= DEFAULT_THRESHOLD, dup),
        "plain cosine >= 0.8 (LiteLLM / GPTCache default)": score(cos >= 0.8, dup),
    }
    consistency = _consistency(hp)
    return {"held_out_pairs": len(held), "duplicates": int(dup.sum()),
            "rows": {k: v.__dict__ for k, v in rows.items()}, "product_agreement": consistency}


def _consistency(hp: Any, n: int = 300) -> float:
    """Share of pairs where the product's own `score_many` agrees with the vectorised evaluation above."""
    from bench.cache.calibrate import vetoes
    from cache import build_cache
    from cache.export import default_embedder_dir
    from cache.settings import DEFAULT_GUARDS, DEFAULT_THRESHOLD
    from core.types import CacheRule

    sub = hp.take(np.arange(min(n, len(hp.a))))
    per_guard = vetoes(sub)
    expected = sub.cosine >= DEFAULT_THRESHOLD
    for g in DEFAULT_GUARDS:
        expected &= ~per_guard[g]

    async def run() -> list[bool]:
        cache = build_cache(None, default_embedder_dir())
        await cache.start()
        try:
            got = await cache.score_many(list(zip(sub.a, sub.b, strict=True)), CacheRule(threshold=DEFAULT_THRESHOLD))
            return [s.hit for s in got]
        finally:
            await cache.stop()

    got = np.asarray(asyncio.run(run()))
    return float((got == expected).mean())


# -- embedding ------------------------------------------------------------------------------------------------
def embedding_latency() -> dict[str, float]:
    from cache.embedder import OnnxEmbedder
    from cache.export import default_embedder_dir

    emb = OnnxEmbedder.load(default_embedder_dir(), threads=1)
    for _ in range(30):
        emb.embed([PROMPT])
    ts = []
    for _ in range(300):
        t = time.perf_counter()
        emb.embed([PROMPT])
        ts.append(time.perf_counter() - t)
    return {"words": len(PROMPT.split()), "p50_ms": _ms(np.median(ts)), "p99_ms": _ms(np.percentile(ts, 99))}


# -- latency at scale (child process per scale) -------------------------------------------------------------
def synthetic(n: int, dim: int, seed: int = 7, rank: int = 64) -> np.ndarray:
    """Low-rank unit vectors (real sentence embeddings occupy a low-dimensional subspace too)."""
    rng = np.random.default_rng(seed)
    basis = rng.standard_normal((rank, dim)).astype(np.float32)
    out = np.empty((n, dim), np.float32)
    for i in range(0, n, 100_000):
        m = min(100_000, n - i)
        x = rng.standard_normal((m, rank)).astype(np.float32) @ basis
        x += 0.1 * rng.standard_normal((m, dim)).astype(np.float32)
        out[i:i + m] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


class _GivenVectors:
    """Stands in for the batcher when the query vector is known: measures the lookup without embedding."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.vectors: dict[str, np.ndarray] = {}

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def embed(self, text: str) -> Any:
        from cache.batcher import Vector

        return Vector(self.vectors[text], False)


async def _scale(n: int, redis_url: str | None) -> dict[str, Any]:
    from prometheus_client import CollectorRegistry

    from cache import CacheSettings, SemanticCache
    from cache.batcher import EmbeddingBatcher
    from cache.embedder import OnnxEmbedder
    from cache.export import default_embedder_dir
    from cache.index import VectorIndex
    from cache.keys import request_key
    from cache.metrics import CacheMetrics
    from cache.store import MemoryStore
    from cache.types import CachedAnswer, CacheEntry
    from core.types import CacheRule
    from core.wire import ChatRequest, Message

    def chat(text: str) -> ChatRequest:
        return ChatRequest(model="tiergate-edge", temperature=0.0, messages=[Message(role="user", content=text)])

    dim = 384
    metrics = CacheMetrics(CollectorRegistry())
    settings = CacheSettings(max_entries=n + 10, sweep_every_s=3600)
    rule = CacheRule(threshold=0.94, ttl_s=86_400)
    ns = request_key(chat("x"), "bench").namespace
    vecs = synthetic(n, dim)
    ans = CachedAnswer("chat", "a synthetic answer of a few words", "stop", "tiergate-edge", "edge", 20, 12)
    ids = [f"{request_key(chat('x'), 'bench').entry_id.split('-')[0]}-syn{i:09d}" for i in range(n)]
    texts = [f"synthetic question number {i}" for i in range(n)]
    now = time.time()
    started = time.perf_counter()
    if redis_url:
        from cache.redis_store import RedisStore

        await _fill_redis(redis_url, settings.prefix, ids, texts, vecs, ns, ans, now + 86_400)
        fill_s = time.perf_counter() - started
        index = VectorIndex(dim, hnsw_at=settings.hnsw_at)
        store: Any = RedisStore(redis_url, index, settings, metrics)
        t = time.perf_counter()
        await store.start(wait_s=3600)
        load_s = time.perf_counter() - t
    else:
        index = VectorIndex(dim, hnsw_at=settings.hnsw_at)
        store = MemoryStore(index, max_entries=n + 10)
        for i in range(n):  # bulk fill without n awaits (the benchmark measures lookups, not fills)
            store._entries[ids[i]] = CacheEntry(ids[i], "bench", ns, texts[i], ans, vecs[i].tobytes(), None, now,
                                                now + 86_400)
        index.upsert_many(ids, [ns] * n, [ids[0].split("-")[0]] * n, vecs, [now + 86_400] * n)
        fill_s, load_s = time.perf_counter() - started, 0.0
    t = time.perf_counter()
    index.maintain(threads=2)  # build the HNSW graph now (in production: in the background, one thread)
    build_s = time.perf_counter() - t

    given = _GivenVectors(dim)
    cache = SemanticCache(store, given, settings=settings, metrics=metrics)  # type: ignore[arg-type]
    rng = np.random.default_rng(11)
    targets = rng.choice(n, QUERIES, replace=False)
    reqs = []
    for i in targets:
        q = vecs[i] + 0.004 * rng.standard_normal(dim).astype(np.float32)  # cosine ~0.997 to entry i
        text = f"synthetic question number {i}"  # same text, different entry id: exact misses, semantic hits
        given.vectors[text] = q / np.linalg.norm(q)
        reqs.append(chat(text))
    for r in reqs[:20]:
        await cache.check(r, "bench", rule)
    # Latency over lookups that reached the store; a lookup bypassed because Redis answered too slowly (this
    # machine's cores are shared) is fast by construction, so it is counted apart, not averaged in.
    no_embed, hits, bypassed = [], 0, 0
    for r in reqs:
        t = time.perf_counter()
        res = await cache.check(r, "bench", rule)
        elapsed = time.perf_counter() - t
        if res.status == "bypass":
            bypassed += 1
            continue
        no_embed.append(elapsed)
        hits += res.status == "hit-semantic"
    assert hits >= 0.9 * len(no_embed), f"only {hits} of {len(no_embed)} synthetic queries hit"

    embedder = OnnxEmbedder.load(default_embedder_dir(), threads=1)
    batcher = EmbeddingBatcher(embedder, metrics, linger_ms=settings.embed_linger_ms)
    cache_e = SemanticCache(store, batcher, settings=settings, metrics=metrics)
    await batcher.start()
    prompts = [f"{PROMPT} (variant {k})" for k in range(QUERIES // 2)]
    for p in prompts[:10]:
        await cache_e.check(chat(p), "bench", rule)
    with_embed, statuses = [], {}
    for p in prompts:
        t = time.perf_counter()
        res = await cache_e.check(chat(p), "bench", rule)
        elapsed = time.perf_counter() - t
        statuses[res.status] = statuses.get(res.status, 0) + 1
        if res.status != "bypass":
            with_embed.append(elapsed)
    await batcher.stop()
    await store.stop()
    return {
        "entries": n, "store": "redis" if redis_url else "in-process", "fill_s": round(fill_s, 1),
        "index_load_s": round(load_s, 1), "hnsw_build_s": round(build_s, 1),
        "semantic_hit_rate": hits / max(len(no_embed), 1), "bypassed": bypassed + statuses.get("bypass", 0),
        "lookups": len(reqs) + len(prompts),
        "no_embedding": {"p50_ms": _ms(np.median(no_embed)), "p99_ms": _ms(np.percentile(no_embed, 99))},
        "with_embedding": {"p50_ms": _ms(np.median(with_embed)), "p99_ms": _ms(np.percentile(with_embed, 99)),
                           "statuses": statuses},
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 0),
    }


async def _fill_redis(url: str, prefix: str, ids: list[str], texts: list[str], vecs: np.ndarray, ns: str,
                      ans: Any, expires: float) -> None:
    import msgspec
    from redis.asyncio import Redis

    r = Redis.from_url(url)
    a = msgspec.json.encode(ans)
    try:
        for i in range(0, len(ids), 2000):
            async with r.pipeline(transaction=False) as pipe:
                for j in range(i, min(i + 2000, len(ids))):
                    key = f"{prefix}:e:{ids[j]}"
                    pipe.hset(key, mapping={"t": "bench", "ns": ns, "x": texts[j], "a": a, "v": vecs[j].tobytes(),
                                            "m": "", "c": repr(expires - 86_400), "e": repr(expires)})
                    pipe.expireat(key, int(expires))
                    pipe.zadd(f"{prefix}:z", {ids[j]: expires})
                await pipe.execute()
    finally:
        await r.aclose()


def _ms(seconds: float) -> float:
    return round(float(seconds) * 1000, 3)


def run_scale(name: str) -> dict[str, Any]:
    """Run one scale in a child process (so its peak RSS is its own), with its own redis-server if needed."""
    n = SCALES[name]
    use_redis = n <= 100_000
    redis_proc, tmp = None, None
    env = os.environ | {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    try:
        if use_redis:
            tmp = tempfile.mkdtemp(prefix="tiergate-bench-redis-")
            port = free_port()
            redis_proc = subprocess.Popen(
                [shutil.which("redis-server") or "/usr/bin/redis-server", "--port", str(port), "--bind",
                 "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", tmp],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            env["BENCH_REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
            _wait_redis(port)
        out = subprocess.run([sys.executable, "-m", "bench.cache", "--child", name], env=env, cwd=REPO,
                             capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"scale {name} failed:\n{out.stderr[-3000:]}\n{out.stdout[-3000:]}")
        result = json.loads(out.stdout.strip().splitlines()[-1])
        if redis_proc is not None:
            result["redis_peak_rss_mib"] = round(peak_rss_mib(redis_proc.pid), 0)
        return result
    finally:
        if redis_proc is not None:
            redis_proc.kill()
            redis_proc.wait()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


# -- report ---------------------------------------------------------------------------------------------------
def render(acc: dict[str, Any], emb: dict[str, float], scales: list[dict[str, Any]], command: str,
           e2e: dict[str, Any] | None = None, when: str | None = None) -> str:
    lines = [HEADING, "", (f"Command: `{command}` (machine: 2 shared cores, no GPU; "
             f"{when or time.strftime('%Y-%m-%d')}). Each scale runs in its own process."), ""]
    lines += [(f"Accuracy on the held-out half of `qqp_pairs_dev.jsonl` ({acc['held_out_pairs']} pairs, "
              f"{acc['duplicates']} duplicates; the other half chose the threshold and guards), same int8 MiniLM "
              "embedder:"), "", "| rule | precision | recall | hits |", "|---|---|---|---|"]
    for name, s in acc["rows"].items():
        lines.append(f"| {name} | {s['precision']:.3f} | {s['recall']:.3f} | {s['hits']} |")
    lines += ["", (f"The product's own scoring path (`SemanticCache.score_many`) agreed with this evaluation on "
              f"{acc['product_agreement'] * 100:.1f}% of a 300-pair sample."), ""]
    lines += [("Lookup latency (`SemanticCache.check`, one namespace holding every entry: the worst case), "
              "synthetic low-rank vectors:"), "",
              ("| entries | store | no embedding p50 / p99 (ms) | with embedding p50 / p99 (ms) | "
              "semantic hit rate | bypassed (Redis too slow) | HNSW build (s) | peak RSS (MiB) | "
              "redis peak RSS (MiB) |"),
              "|---|---|---|---|---|---|---|---|---|"]
    for r in scales:
        lines.append(
            f"| {r['entries']:,} | {r['store']} | {r['no_embedding']['p50_ms']} / {r['no_embedding']['p99_ms']} | "
            f"{r['with_embedding']['p50_ms']} / {r['with_embedding']['p99_ms']} | {r['semantic_hit_rate']:.2f} | "
            f"{r['bypassed']} of {r['lookups']} | {r['hnsw_build_s']} | {r['peak_rss_mib']:.0f} | "
            f"{r.get('redis_peak_rss_mib', '-')} |")
    lines += ["", (f"Embedding one {emb['words']}-word prompt, one thread: p50 {emb['p50_ms']} ms, "
              f"p99 {emb['p99_ms']} ms."), ""]
    lines += [
        "Reading it:",
        ("- \"no embedding\" is a whole `check()` with the query vector given: exact read, nearest-neighbour "
         "search in the request's namespace, one pipelined read of the candidates, exact re-scoring, guards. "
         "\"with embedding\" adds the batcher and the int8 MiniLM on one thread (those prompts miss)."),
        ("- 1M entries run on the in-process store (the Redis layout is the same per entry; 1M hashes with "
         "float32 vectors need ~3 GB in Redis). The HNSW graph is built in the background, one chunk at a "
         "time; searches meanwhile also scan the not-yet-flushed rows exactly. Its build time and the peak RSS "
         "(which includes the benchmark's own copy of every vector and entry) are the price of 1M entries in "
         "one namespace; usearch int8 keeps the graph itself near 0.5 GB."),
        ("- The labelled pairs' precision is a floor: many pairs labelled \"not duplicate\" at high cosine "
         "are paraphrases (see docs/cache.md). The 0.95-at-recall-0.40 target is out of reach on these labels "
         "for any threshold and guard set tried; the shipped setting is the highest-recall one with precision "
         ">= 0.90 on the calibration half (`python -m bench.cache.calibrate`)."),
        "- Timings depend on the other work on the two shared cores; p99 especially.",
        "",
    ]
    if e2e:
        lines += e2e_render(e2e)
    return "\n".join(lines)


def write_docs(section: str) -> None:
    write_section(HEADING, section, DOCS)


PARTS = ("accuracy", "scales", "e2e")


def main() -> None:
    ap = argparse.ArgumentParser(description="tiergate semantic cache benchmark")
    ap.add_argument("--scales", default="10k,100k,1m")
    ap.add_argument("--only", help=("comma-separated parts to run: accuracy (with embedding speed), scales, e2e "
                                    "(hit vs miss through a real gateway); the other parts are kept from the last "
                                    "results (bench/results/cache.json). Default: all"))
    ap.add_argument("--e2e-requests", type=int, default=300, help="e2e: requests per kind (miss, exact, semantic) "
                                                                  "and mode (JSON, SSE)")
    ap.add_argument("--e2e-stores", default="memory,redis", help="e2e: cache stores to run the gateway with")
    ap.add_argument("--upstream-ttft-ms", type=float, default=80.0, help="e2e: the upstream's time to first token")
    ap.add_argument("--upstream-tbt-ms", type=float, default=5.0, help="e2e: the upstream's time between tokens")
    ap.add_argument("--write-docs", action="store_true", help="replace this benchmark's section of docs/benchmarks.md")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--render", action="store_true", help="re-render the last results (bench/results/cache.json)")
    args = ap.parse_args()
    results_file = REPO / "bench" / "results" / "cache.json"
    last = json.loads(results_file.read_text()) if results_file.is_file() else {}
    if args.render:
        section = render(last["accuracy"], last["embedding"], last["scales"], last.get("command", ""),
                         last.get("e2e"), last.get("when"))
        print(section)
        if args.write_docs:
            write_docs(section)
        return
    if args.child:
        print(json.dumps(asyncio.run(_scale(SCALES[args.child], os.environ.get("BENCH_REDIS_URL")))))
        return
    parts = [p.strip() for p in (args.only or ",".join(PARTS)).split(",") if p.strip()]
    if unknown := set(parts) - set(PARTS):
        ap.error(f"--only: unknown part(s) {', '.join(sorted(unknown))}; choose from {', '.join(PARTS)}")
    stores = tuple(s.strip() for s in args.e2e_stores.split(",") if s.strip())
    if unknown := set(stores) - {"memory", "redis"}:
        ap.error(f"--e2e-stores: unknown store(s) {', '.join(sorted(unknown))}; choose from memory, redis")
    command = ".venv/bin/python -m bench.cache"
    if args.only:
        command += f" --only {','.join(parts)}"
    if args.scales != "10k,100k,1m" and "scales" in parts:
        command += f" --scales {args.scales}"
    if "e2e" in parts:
        for flag, value, default in (("--e2e-requests", args.e2e_requests, 300),
                                     ("--e2e-stores", args.e2e_stores, "memory,redis"),
                                     ("--upstream-ttft-ms", args.upstream_ttft_ms, 80.0),
                                     ("--upstream-tbt-ms", args.upstream_tbt_ms, 5.0)):
            if value != default:
                command += f" {flag} {value:g}" if isinstance(value, float) else f" {flag} {value}"
    command += " --write-docs" if args.write_docs else ""

    out = dict(last)  # parts not run this time keep their last results
    if "accuracy" in parts:
        print("accuracy on held-out pairs ...", file=sys.stderr)
        out["accuracy"] = accuracy()
        print("embedding latency ...", file=sys.stderr)
        out["embedding"] = embedding_latency()
    if "scales" in parts:
        scales = []
        for name in [s.strip() for s in args.scales.split(",") if s.strip()]:
            print(f"lookup latency at {name} entries ...", file=sys.stderr)
            scales.append(run_scale(name))
        out["scales"] = scales
    if "accuracy" in parts or "scales" in parts:
        out["command"], out["when"] = command, time.strftime("%Y-%m-%d")
    if "e2e" in parts:
        e2e = run_e2e(args.e2e_requests, stores, args.upstream_ttft_ms, args.upstream_tbt_ms)
        e2e["command"] = command
        out["e2e"] = e2e
    results_file.parent.mkdir(parents=True, exist_ok=True)
    results_file.write_text(json.dumps(out, indent=2))
    if not all(k in out for k in ("accuracy", "embedding", "scales")):
        section = "\n".join(e2e_render(out["e2e"]))  # nothing else measured yet: print only this part
        print(section)
        if args.write_docs:
            sys.exit("--write-docs needs the accuracy and scale results too: run the whole benchmark once")
        return
    section = render(out["accuracy"], out["embedding"], out["scales"], out.get("command", ""), out.get("e2e"),
                     out.get("when"))
    print(section)
    if args.write_docs:
        write_docs(section)


if __name__ == "__main__":
    main()
