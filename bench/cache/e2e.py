"""End to end through a real gateway: what a cache hit saves a client, next to a miss, in one run.

    .venv/bin/python -m bench.cache --only e2e [--e2e-requests 300] [--e2e-stores memory,redis7,redis8]

Starts `tiergate serve` (one process, pinned to CPU 0, the exported int8 ONNX embedder from `.tiergate/embedder`,
the in-process store or a fresh redis-server: Debian's 7.0, the stream layout, or 8.2.3, vector sets) in front of `tests/support/instant_upstream.py` made model-like by a fixed
generation time (`--ttft-ms`, `--tbt-ms`; upstream, redis-server and this client on CPU 1). Then, one request at a
time over one keep-alive connection, for JSON and for SSE, with N distinct question pairs each:

- miss: the pair's first question, new to the cache (the gateway asks the upstream and stores the answer);
- exact hit: the same request again;
- semantic hit: the pair's second question, a paraphrase labelled duplicate in `qqp_pairs_dev.jsonl` that the
  shipped threshold and guards accept (`SemanticCache.score_many`, which `tiergate cache score-pairs` runs).

Requests go in blocks of 10 (10 misses, their 10 exact repeats, their 10 paraphrases), so every kind sees the
same machine noise and every answer is stored well before it is asked for again. Each request's
`x-tiergate-cache` header is tallied, so every kind is shown to be what it claims.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.cache.pairs import load_pairs
from bench.procs import Server, free_port, peak_rss_mib, redis_answers, redis_binary
from tiergate.cache import build_cache
from tiergate.cache.guards import signature, veto
from tiergate.cache.keys import normalize_text
from tiergate.cache.settings import DEFAULT_GUARDS, DEFAULT_THRESHOLD
from tiergate.cache.training.export import default_embedder_dir, is_complete
from tiergate.core.types import CacheRule

KEY = "tg-bench-cache-key"
TENANT = "bench"
MODEL = "tiergate-edge"
BLOCK = 10
WARMUP_PAIRS = 20
DIRECT_REQUESTS = 50
KINDS = ("miss", "exact", "semantic")
EXPECTED = {"miss": "miss", "exact": "hit-exact", "semantic": "hit-semantic"}

POLICY = """\
# bench/cache e2e policy: one edge tier whose only endpoint is the instant upstream; the shipped cache settings.
version: 1
defaults:
  cache:
    enabled: true
    semantic: true
    threshold: {threshold}
    ttl_s: 3600
    max_temperature: 0.3
tiers:
  edge:
    kind: edge
    model: {model}
    endpoints: ["http://127.0.0.1:{port}"]
rules:
  - name: everything-to-edge
    tier: edge
"""


# -- the question pairs -----------------------------------------------------------------------------------------
def pick_pairs(k: int, seed: int = 5, min_cos: float = 0.95, apart: float = 0.85) -> list[tuple[str, str]]:
    """`k` duplicate-labelled pairs (a, b) that the shipped settings score as semantic hits, chosen so that no `a`
    is near another (every first request is a true miss) and no `b` equals any `a` once normalised."""
    p = load_pairs()
    cos = p.cosine
    cand = np.flatnonzero(p.duplicate & (cos >= max(min_cos, DEFAULT_THRESHOLD)) & (cos < 0.995))
    cand = cand[np.random.default_rng(seed).permutation(len(cand))]
    chosen: list[int] = []
    texts: set[str] = set()
    for i in cand:
        a, b = normalize_text(p.a[i]), normalize_text(p.b[i])
        if a == b or a in texts or b in texts or veto(signature(p.a[i]), signature(p.b[i]), DEFAULT_GUARDS):
            continue
        if chosen:
            va = p.va[chosen]
            if (va @ p.va[i]).max() >= apart or (va @ p.vb[i]).max() >= apart:
                continue
        chosen.append(int(i))
        texts |= {a, b}
        if len(chosen) >= int(k * 1.1) + 10:
            break
    pairs = [(p.a[i], p.b[i]) for i in chosen]

    async def confirm() -> list[bool]:  # the product's own verdict, as `tiergate cache score-pairs` gives it
        cache = build_cache(None, default_embedder_dir())
        await cache.start()
        try:
            return [s.hit for s in await cache.score_many(pairs, CacheRule(threshold=DEFAULT_THRESHOLD))]
        finally:
            await cache.stop()

    hits = asyncio.run(confirm())
    pairs = [pr for pr, h in zip(pairs, hits, strict=True) if h]
    if len(pairs) < k:
        raise RuntimeError(f"only {len(pairs)} usable hit pairs, {k} wanted")
    return pairs[:k]


# -- processes --------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def redis_server(version: str = "redis7") -> Iterator[tuple[str, int]]:
    """A fresh redis-server (no persistence) on its own port; yields (url, pid)."""
    tmp = tempfile.mkdtemp(prefix="tiergate-bench-redis-")
    port = free_port()
    cmd = [redis_binary(version), "--port", str(port), "--bind", "127.0.0.1",
           "--save", "", "--appendonly", "no", "--dir", tmp]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.sched_setaffinity(proc.pid, {1})  # with the upstream and the client; the gateway has CPU 0
    try:
        wait_redis(port)
        yield f"redis://127.0.0.1:{port}/0", proc.pid
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def wait_redis(port: int) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if redis_answers(port):
            return
        time.sleep(0.05)
    raise RuntimeError("redis-server did not start")


def start_gateway(tmp: Path, up_port: int, redis_url: str | None, embedder: Path,
                  store: str = "memory") -> tuple[Server, int]:
    policy = tmp / "policy.yaml"
    policy.write_text(POLICY.format(threshold=DEFAULT_THRESHOLD, model=MODEL, port=up_port))
    port = free_port()
    env = {"TIERGATE_POLICY": str(policy), "TIERGATE_API_KEYS": f"{KEY}={TENANT}", "TIERGATE_LOG_LEVEL": "warning",
           "TIERGATE_EMBEDDER": str(embedder), "TIERGATE_REDIS_URL": redis_url or "", "TIERGATE_DRAIN_DELAY_S": "0",
           "OMP_NUM_THREADS": "1"}
    gw = Server(f"tiergate ({store})", [str(Path(sys.executable).parent / "tiergate"), "serve", "--port", str(port)],
                f"http://127.0.0.1:{port}/readyz", env=env, cpus={0}, log=tmp / f"gateway-{store}.log").start()
    return gw, port


# -- the client -------------------------------------------------------------------------------------------------
def _body(text: str, stream: bool, model: str = MODEL) -> dict[str, Any]:
    return {"model": model, "temperature": 0, "max_tokens": 64, "stream": stream,
            "messages": [{"role": "user", "content": text}]}


def one(client: Any, url: str, text: str, stream: bool, model: str = MODEL) -> dict[str, Any]:
    """One request, timed from send to the first body bytes and to the last; with the gateway's headers."""
    t0 = time.perf_counter()
    first = None
    chunks = []
    with client.stream("POST", url, json=_body(text, stream, model), headers={"Authorization": f"Bearer {KEY}"}) as r:
        for chunk in r.iter_raw():
            if first is None:
                first = time.perf_counter()
            chunks.append(chunk)
        end = time.perf_counter()
    body = b"".join(chunks)
    if r.status_code != 200:
        raise RuntimeError(f"{url}: HTTP {r.status_code}: {body[:300]!r}")
    if stream and not body.rstrip().endswith(b"data: [DONE]"):
        raise RuntimeError(f"{url}: stream did not end with [DONE]: {body[-200:]!r}")
    overhead = r.headers.get("x-tiergate-overhead-ms")
    return {"total": end - t0, "first": (first or end) - t0, "cache": r.headers.get("x-tiergate-cache", "-"),
            "overhead_ms": float(overhead) if overhead else None, "body": body}


def _answer_text(body: bytes, stream: bool) -> str:
    if not stream:
        return json.loads(body)["choices"][0]["message"]["content"]
    out = []
    for line in body.split(b"\n"):
        if line.startswith(b"data: {"):
            for c in json.loads(line[6:])["choices"]:
                out.append(c.get("delta", {}).get("content") or "")
    return "".join(out)


def _pct(xs: list[float], q: float) -> float:
    return round(float(np.percentile(xs, q)) * 1000, 2) if xs else float("nan")


def summarize(samples: list[dict[str, Any]], stream: bool, expected: str | None = None) -> dict[str, Any]:
    """Latency over the requests whose `x-tiergate-cache` is `expected` (all when None); the tally counts all: a
    lookup bypassed because Redis answered too slowly on this shared machine is another kind, not averaged in."""
    tally = dict(Counter(s["cache"] for s in samples))
    samples = [s for s in samples if expected is None or s["cache"] == expected]
    tot = [s["total"] for s in samples]
    out: dict[str, Any] = {"n": len(samples), "p50_ms": _pct(tot, 50), "p99_ms": _pct(tot, 99),
                           "cache_header": tally}
    if stream:
        first = [s["first"] for s in samples]
        out |= {"first_byte_p50_ms": _pct(first, 50), "first_byte_p99_ms": _pct(first, 99)}
    ov = [s["overhead_ms"] for s in samples if s["overhead_ms"] is not None]
    out["gateway_overhead_p50_ms"] = round(statistics.median(ov), 3) if ov else None
    return out


def run_mode(client: Any, url: str, pairs: list[tuple[str, str]], warm: list[tuple[str, str]],
             stream: bool) -> dict[str, Any]:
    """Blocks of BLOCK: misses, then the same requests again (exact), then the paraphrases (semantic)."""
    for a, _ in warm:  # not counted: first connections, code paths, the embedder's first calls
        one(client, url, a, stream)
    time.sleep(0.2)
    for a, b in warm:
        one(client, url, a, stream)
        one(client, url, b, stream)
    samples: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}
    answers_differ = 0
    distinct_misses: set[str] = set()
    for start in range(0, len(pairs), BLOCK):
        block = pairs[start:start + BLOCK]
        for kind, texts in (("miss", [a for a, _ in block]), ("exact", [a for a, _ in block]),
                            ("semantic", [b for _, b in block])):
            for t in texts:
                s = one(client, url, t, stream)
                samples[kind].append(s)
        # a hit must give back the answer generated for its pair's question (the upstream's first token names
        # the question it answered, so answers to different questions differ)
        n = len(block)
        for i in range(n):
            ref = _answer_text(samples["miss"][-n + i]["body"], stream)
            for kind in ("exact", "semantic"):
                s = samples[kind][-n + i]
                answers_differ += s["cache"] == EXPECTED[kind] and _answer_text(s["body"], stream) != ref
        distinct_misses.update(_answer_text(s["body"], stream) for s in samples["miss"][-n:])
    for ss in samples.values():
        for s in ss:
            s.pop("body")
    out = {k: summarize(v, stream, EXPECTED[k]) for k, v in samples.items()}
    out["hit_answers_differing_from_miss"] = answers_differ
    if len(distinct_misses) != len(samples["miss"]):
        raise RuntimeError("the upstream gave the same answer to different questions: is it running with --echo?")
    return out


def direct(client: Any, up_port: int, stream: bool) -> dict[str, Any]:
    """The upstream alone (same client): the generation time every miss pays on top of the gateway."""
    url = f"http://127.0.0.1:{up_port}/v1/chat/completions"
    for i in range(5):
        one(client, url, f"direct warm-up {i}", stream, "instant")
    s = [one(client, url, f"direct question {i}", stream, "instant") for i in range(DIRECT_REQUESTS)]
    return summarize(s, stream)


def cache_errors(metrics_url: str) -> dict[str, float]:
    """The gateway's `tiergate_cache_errors_total` by op: why lookups bypassed (e.g. Redis timeouts)."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return {}
    pattern = r'^tiergate_cache_errors_total\{op="([^"]+)"\} (\S+)$'
    return {m[1]: float(m[2]) for m in re.finditer(pattern, text, re.MULTILINE)}


# -- the whole part ---------------------------------------------------------------------------------------------
def run(n: int = 300, stores: tuple[str, ...] = ("memory", "redis7", "redis8"), ttft_ms: float = 80.0, tbt_ms: float = 5.0,
        chunks: int = 16) -> dict[str, Any]:
    embedder = default_embedder_dir()
    if not is_complete(embedder):
        raise RuntimeError(f"no exported embedder in {embedder}: run `tiergate prepare` "
                           "(or `tiergate cache export-embedder`)")
    print(f"e2e: picking {2 * n + WARMUP_PAIRS} question pairs ...", file=sys.stderr)
    pairs = pick_pairs(2 * n + WARMUP_PAIRS)
    warm, by_mode = pairs[2 * n:], {"json": pairs[:n], "sse": pairs[n:2 * n]}
    tmp = Path(tempfile.mkdtemp(prefix="tiergate-bench-e2e-"))
    py = sys.executable
    up_port = free_port()
    upstream = Server("upstream", [py, "-m", "tests.support.instant_upstream", "--port", str(up_port), "--chunks", str(chunks),
                                   "--ttft-ms", str(ttft_ms), "--tbt-ms", str(tbt_ms), "--echo"],
                      f"http://127.0.0.1:{up_port}/health", cpus={1}, log=tmp / "upstream.log").start()
    affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {1})  # the client shares CPU 1 with the upstream; the gateway has CPU 0
    result: dict[str, Any] = {
        "requests_per_kind": n, "block": BLOCK, "warmup_pairs": len(warm),
        "upstream": {"ttft_ms": ttft_ms, "tbt_ms": tbt_ms, "tokens": chunks}, "stores": [],
        "when": time.strftime("%Y-%m-%d"),
    }
    try:
        with httpx.Client(timeout=60) as client:
            print("e2e: upstream alone ...", file=sys.stderr)
            result["upstream"]["direct"] = {"json": direct(client, up_port, False),
                                            "sse": direct(client, up_port, True)}
        for store in stores:
            with contextlib.ExitStack() as stack:
                redis_url, redis_pid = None, None
                store = "redis7" if store == "redis" else store
                if store != "memory":
                    redis_url, redis_pid = stack.enter_context(redis_server(store))
                print(f"e2e: gateway with the {store} store ...", file=sys.stderr)
                gw, gw_port = start_gateway(tmp, up_port, redis_url, embedder, store)
                stack.callback(gw.stop)
                url = f"http://127.0.0.1:{gw_port}/v1/chat/completions"
                label = {"memory": "in-process", "redis7": "Redis 7 (stream)", "redis8": "Redis 8 (vector sets)"}
                row: dict[str, Any] = {"store": label[store]}
                with httpx.Client(timeout=60) as client:
                    for mode, ps in by_mode.items():
                        half = len(warm) // 2
                        w = warm[:half] if mode == "json" else warm[half:]
                        print(f"e2e:   {mode}: {len(ps)} x {KINDS} ...", file=sys.stderr)
                        row[mode] = run_mode(client, url, ps, w, mode == "sse")
                row["cache_errors"] = cache_errors(f"http://127.0.0.1:{gw_port}/metrics")
                row["gateway_peak_rss_mib"] = round(peak_rss_mib(gw.pid))
                if redis_pid is not None:
                    row["redis_peak_rss_mib"] = round(peak_rss_mib(redis_pid))
                result["stores"].append(row)
    finally:
        os.sched_setaffinity(0, affinity)
        result["upstream"]["peak_rss_mib"] = round(peak_rss_mib(upstream.pid))
        upstream.stop()
    shutil.rmtree(tmp, ignore_errors=True)  # kept (with the servers' logs) when a run fails
    return result


def render(e2e: dict[str, Any], machine: str = "") -> list[str]:
    up = e2e["upstream"]
    lines = ["### End to end through the gateway: hit vs miss", "",
             (f"Command: `{e2e.get('command', '.venv/bin/python -m bench.cache --only e2e')}` "
              f"({e2e.get('when', '')}). `tiergate serve` (one process on CPU 0, int8 MiniLM from "
              "`.tiergate/embedder`) "
              f"in front of `tests/support/instant_upstream.py` with a fixed model-like generation time: first token after "
              f"{up['ttft_ms']:g} ms, then {up['tbt_ms']:g} ms per token, {up['tokens']} tokens "
              f"(upstream, redis-server and client on CPU 1). One client, one request at a time, "
              f"{e2e['requests_per_kind']} requests per kind and mode, in blocks of {e2e['block']} (misses, their "
              f"exact repeats, their paraphrases); paraphrases are duplicate-labelled pairs from "
              "`qqp_pairs_dev.jsonl` that the shipped threshold and guards accept, a different set per mode. "
              f"{machine}"), "",
             ("| store | mode | kind | p50 / p99 ms (to last byte) | SSE first byte p50 / p99 ms | "
              "p50 vs miss | gateway's own ms p50 (`x-tiergate-overhead-ms`) | `x-tiergate-cache` tally |"),
             "|---|---|---|---|---|---|---|---|"]
    for mode in ("json", "sse"):
        d = up["direct"][mode]
        fb = f"{d['first_byte_p50_ms']} / {d['first_byte_p99_ms']}" if mode == "sse" else "-"
        lines.append(f"| (upstream alone) | {mode} | - | {d['p50_ms']} / {d['p99_ms']} | {fb} | - | - | - |")
    for row in e2e["stores"]:
        for mode in ("json", "sse"):
            m = row[mode]
            miss = m["miss"]["p50_ms"]
            for kind in KINDS:
                k = m[kind]
                fb = f"{k['first_byte_p50_ms']} / {k['first_byte_p99_ms']}" if mode == "sse" else "-"
                ratio = "1" if kind == "miss" else f"{k['p50_ms'] / miss:.3f}"
                tally = ", ".join(f"{h} {c}" for h, c in sorted(k["cache_header"].items()))
                ov = k["gateway_overhead_p50_ms"]
                lines.append(f"| {row['store']} | {mode} | {kind} | {k['p50_ms']} / {k['p99_ms']} | {fb} | {ratio} | "
                             f"{ov if ov is not None else '-'} | {tally} |")
    rss = "; ".join(f"gateway ({r['store']}) {r['gateway_peak_rss_mib']} MiB" for r in e2e["stores"])
    rss += "".join(f"; redis-server {r['redis_peak_rss_mib']} MiB" for r in e2e["stores"] if "redis_peak_rss_mib" in r)
    errors = "; ".join(f"{r['store']}: " + (", ".join(f"{op} {n:g}" for op, n in sorted(r["cache_errors"].items()))
                                            or "none") for r in e2e["stores"] if "cache_errors" in r)
    differ = sum(r[m]["hit_answers_differing_from_miss"] for r in e2e["stores"] for m in ("json", "sse"))
    bypassed = any(h == "bypass" for r in e2e["stores"] for m in ("json", "sse") for k in KINDS
                   for h in r[m][k]["cache_header"])
    lines += ["", ("Latencies are over the requests whose `x-tiergate-cache` header is the kind's own (`miss`, "
              "`hit-exact`, `hit-semantic`); the tally shows every request of the kind." + (
              " A `bypass` is a lookup given up because the store did not answer in time: a Redis command gets "
              "80 ms, which a busy shared core sometimes exceeds; the request then goes upstream and nothing is "
              "stored, so an exact repeat of a bypassed miss misses." if bypassed else "") +
              " The gateways' `tiergate_cache_errors_total` at the end (a whole lookup over 500 ms would show as "
              f"`lookup_timeout`): {errors or '-'}."), "",
              (f"Peak RSS: {rss}; upstream {up['peak_rss_mib']} MiB. Hits whose answer was not the one "
              f"generated for their pair's first question (the upstream names the question in its answer): "
              f"{differ}."), "",
              ("- A hit costs the exact read (exact) or the embedding, the nearest-neighbour search and the guards "
               "(semantic) and then the rendering of the stored answer; a miss costs the same lookup, the upstream "
               "hop and the generation, and stores the answer afterwards (JSON: after the response is sent; SSE: "
               "after the last chunk). The \"gateway's own\" column excludes the upstream's time on misses; on hits "
               "it is the whole time spent in the gateway until the response starts."),
              ("- With an instant upstream the whole difference would be the hop; the fixed generation time above "
               "stands in for the smallest model (see bench/edge: ~84 ms to first token, ~5 ms between tokens "
               "for one stream). Real answers are longer, so real misses cost more and the ratios only get smaller."),
              ""]
    return lines
