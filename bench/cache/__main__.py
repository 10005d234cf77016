"""Semantic cache benchmark: accuracy on labelled pairs, Redis 8 beside Redis 7 at 10k / 100k / 1M entries,
error-bounded hits, embedding speed, memory, and hit vs miss latency end to end through a real gateway.

    .venv/bin/python -m bench.cache [--scales 10k,100k,1m] [--versions redis7,redis8] [--write-docs]
    .venv/bin/python -m bench.cache --only e2e [--e2e-requests 300] [--e2e-stores memory,redis7,redis8] [--write-docs]

`--only accuracy,scales,errbound,e2e` runs some parts and keeps the others' last results
(bench/results/cache.json, committed), so `--write-docs` always writes the whole section.

One run prints, side by side:
- precision / recall on the held-out half of ../shared/data/cache/qqp_pairs_dev.jsonl for tiergate's shipped
  settings (calibrated threshold + guards) and for the plain "cosine >= 0.8" rule, with the same embedder;
- at 10k, 100k and 1M entries in one namespace, on Redis 7 (stream layout) and Redis 8 (vector sets)
  (bench/cache/scale.py): `SemanticCache.check()` p50/p99 with and without embedding, a real gateway's time
  from start to its first semantic hit and its RSS, the Redis server's RSS;
- the error-bound table (bench/cache/errbound.py): for bounds 2 %, 5 %, 10 % (and 15 %, 20 %), the measured
  false-hit rate and recall of the product's error-bounded decision replayed on the labelled pairs, beside
  fixed thresholds, and the hindsight ceiling of three rankings at each bound (bench/cache/ceiling.py);
- embedding p50 for a ~20-word prompt on one thread;
- end to end (bench/cache/e2e.py): `tiergate serve` with the exported embedder, in-process store, Redis 7 and
  Redis 8, in front of the instant upstream with a fixed generation time; p50/p99 of misses, exact hits and
  semantic hits (JSON and SSE), the `x-tiergate-cache` header tally, peak RSS of gateway, upstream and
  redis-server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

import numpy as np

from bench.cache import errbound, scale
from bench.cache.calibrate import labelled, score
from bench.cache.e2e import render as e2e_render
from bench.cache.e2e import run as run_e2e
from bench.cache.pairs import load_pairs, split
from bench.report import REPO, RESULTS, machine_facts, machine_line, write_section
from tiergate.cache import build_cache
from tiergate.cache.embedder import OnnxEmbedder
from tiergate.cache.settings import DEFAULT_THRESHOLD
from tiergate.cache.training.export import default_embedder_dir
from tiergate.core.types import CacheRule

DOCS = REPO / "docs" / "benchmarks.md"
HEADING = "## Semantic cache (bench/cache)"
PROMPT = ("Can you explain in simple terms how a neural network learns from the examples it sees during "
          "training and why?")
QUERIES = 400


# -- accuracy -------------------------------------------------------------------------------------------------
def accuracy() -> dict[str, Any]:
    pairs = load_pairs()
    _, held = split(len(pairs.a))
    hp = pairs.take(held)
    cos, dup = hp.cosine, hp.duplicate
    vetoed = labelled(hp).vetoed
    rows = {
        f"tiergate (cos >= {DEFAULT_THRESHOLD} + guards)": score((cos >= DEFAULT_THRESHOLD) & ~vetoed, dup),
        f"cosine >= {DEFAULT_THRESHOLD} alone (no guards)": score(cos >= DEFAULT_THRESHOLD, dup),
        "plain cosine >= 0.8 (LiteLLM / GPTCache default)": score(cos >= 0.8, dup),
    }
    consistency = _consistency(hp, (cos >= DEFAULT_THRESHOLD) & ~vetoed)
    return {"held_out_pairs": len(held), "duplicates": int(dup.sum()),
            "rows": {k: v.__dict__ for k, v in rows.items()}, "product_agreement": consistency}


def _consistency(hp: Any, hits: np.ndarray, n: int = 300) -> float:
    """Share of pairs where the product's own `score_many` agrees with the vectorised evaluation above (`hits`)."""
    sub = hp.take(np.arange(min(n, len(hp.a))))
    expected = hits[: len(sub.a)]

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
    emb = OnnxEmbedder.load(default_embedder_dir(), threads=1)
    for _ in range(30):
        emb.embed([PROMPT])
    ts = []
    for _ in range(300):
        t = time.perf_counter()
        emb.embed([PROMPT])
        ts.append(time.perf_counter() - t)
    return {"words": len(PROMPT.split()), "p50_ms": scale._ms(np.median(ts)), "p99_ms": scale._ms(np.percentile(ts, 99))}


# -- report ---------------------------------------------------------------------------------------------------
def render(out: dict[str, Any]) -> str:
    acc, emb, command, when = out["accuracy"], out["embedding"], out.get("command", ""), out.get("when")
    facts = _facts(out, "accuracy")
    lines = [HEADING, "", (f"Command: `{command}` ({when or time.strftime('%Y-%m-%d')}). Raw results: "
                           f"`bench/results/cache.json`. {facts}"), ""]
    lines += [(f"Accuracy on the held-out half of `qqp_pairs_dev.jsonl` ({acc['held_out_pairs']} pairs, "
              f"{acc['duplicates']} duplicates; the other half chose the threshold and guards), same int8 MiniLM "
              "embedder:"), "", "| rule | precision | recall | hits |", "|---|---|---|---|"]
    for name, s in acc["rows"].items():
        lines.append(f"| {name} | {s['precision']:.3f} | {s['recall']:.3f} | {s['hits']} |")
    lines += ["", (f"The product's own scoring path (`SemanticCache.score_many`) agreed with this evaluation on "
              f"{acc['product_agreement'] * 100:.1f}% of a 300-pair sample."), ""]
    sizes = sorted({r["entries"] for r in out["scales"]})
    lines += [f"### Redis 8 (vector sets) beside Redis 7 (stream layout) at {', '.join(f'{n:,}' for n in sizes)} "
              "entries", ""]
    lines += [f"Command: `{out.get('scales_command', command)}` ({out.get('scales_when', when)}). {_facts(out, 'scales')}"
              + (f" {out['scales_note']}" if out.get("scales_note") else ""), ""]
    lines += scale.render(out["scales"])
    lines += ["", (f"Embedding one {emb['words']}-word prompt, one thread: p50 {emb['p50_ms']} ms, "
              f"p99 {emb['p99_ms']} ms."), ""]
    lines += [
        "Reading it:",
        ("- `check()` \"no embedding\" is a whole lookup with the query vector given (cosine ~0.997 to a stored "
         "entry: exact read, nearest-neighbour search in the namespace, candidate reads, exact re-score, guards); "
         "\"with embedding\" adds the batcher and the int8 MiniLM on one thread (those prompts miss). Each runs in "
         "a fresh process; \"bypassed\" counts lookups given up because Redis did not answer within 80 ms."),
        ("- Redis 7: that process (like every gateway replica) first loads every entry by SCAN and builds its "
         "HNSW graph (\"load + build\"). Redis 8: nothing is loaded, the search runs in Redis (its CPU per lookup "
         "is shown: the figure that does not depend on the load of the shared machine)."),
        ("- Gateway: `tiergate serve` started against the filled Redis, asked a paraphrase of a stored real "
         "question every 50 ms until the first `hit-semantic` (its upstream always fails, so nothing new is "
         "stored); \"ready\" is its first 200 on /readyz. Its RSS is read after that and 200 more hits."),
        ("- Timings depend on the other work on the two shared cores (the load average when each row started is "
         "shown); p99 especially."),
        "",
    ]
    if "errbound" in out:
        lines += errbound.render(out["errbound"], out["errbound"].get("command", command),
                                 out["errbound"].get("when", when or ""), _facts(out, "errbound"))
        lines += [""]
    if out.get("e2e"):
        lines += e2e_render(out["e2e"], _facts(out, "e2e"))
    return "\n".join(lines)


def _facts(out: dict[str, Any], part: str) -> str:
    """The machine as the run of that part found it (each part keeps its own: they run at different times)."""
    machine = out.get("machines", {}).get(part)
    return machine_line(machine["start"], machine["end"]) if machine else "Machine: not recorded with this part."


def write_docs(section: str) -> None:
    write_section(HEADING, section, DOCS)


PARTS = ("accuracy", "scales", "errbound", "e2e")


def main() -> None:
    ap = argparse.ArgumentParser(description="tiergate semantic cache benchmark")
    ap.add_argument("--scales", default="10k,100k,1m")
    ap.add_argument("--versions", default="redis7,redis8", help="scales: Redis versions side by side")
    ap.add_argument("--only", help=("comma-separated parts to run: accuracy (with embedding speed), scales, errbound, "
                                    "e2e (hit vs miss through a real gateway); the other parts are kept from the "
                                    "last results (bench/results/cache.json). Default: all"))
    ap.add_argument("--e2e-requests", type=int, default=300, help="e2e: requests per kind (miss, exact, semantic) "
                                                                  "and mode (JSON, SSE)")
    ap.add_argument("--e2e-stores", default="memory,redis7,redis8", help="e2e: cache stores to run the gateway with")
    ap.add_argument("--upstream-ttft-ms", type=float, default=80.0, help="e2e: the upstream's time to first token")
    ap.add_argument("--upstream-tbt-ms", type=float, default=5.0, help="e2e: the upstream's time between tokens")
    ap.add_argument("--write-docs", action="store_true", help="replace this benchmark's section of docs/benchmarks.md")
    ap.add_argument("--render", action="store_true", help="re-render the last results (bench/results/cache.json)")
    args = ap.parse_args()
    results_file = RESULTS / "cache.json"
    last = json.loads(results_file.read_text()) if results_file.is_file() else {}
    if args.render:
        section = render(last)
        print(section)
        if args.write_docs:
            write_docs(section)
        return
    parts = [p.strip() for p in (args.only or ",".join(PARTS)).split(",") if p.strip()]
    if unknown := set(parts) - set(PARTS):
        ap.error(f"--only: unknown part(s) {', '.join(sorted(unknown))}; choose from {', '.join(PARTS)}")
    stores = tuple(s.strip() for s in args.e2e_stores.split(",") if s.strip())
    if unknown := set(stores) - {"memory", "redis", "redis7", "redis8"}:
        ap.error(f"--e2e-stores: unknown store(s) {', '.join(sorted(unknown))}; choose from memory, redis7, redis8")
    versions = tuple(v.strip() for v in args.versions.split(",") if v.strip())
    if unknown := set(versions) - set(scale.VERSIONS):
        ap.error(f"--versions: unknown {', '.join(sorted(unknown))}; choose from redis7, redis8")
    command = ".venv/bin/python -m bench.cache"
    if args.only:
        command += f" --only {','.join(parts)}"
    if "scales" in parts:
        if args.scales != "10k,100k,1m":
            command += f" --scales {args.scales}"
        if args.versions != "redis7,redis8":
            command += f" --versions {args.versions}"
    if "e2e" in parts:
        for flag, value, default in (("--e2e-requests", args.e2e_requests, 300),
                                     ("--e2e-stores", args.e2e_stores, "memory,redis7,redis8"),
                                     ("--upstream-ttft-ms", args.upstream_ttft_ms, 80.0),
                                     ("--upstream-tbt-ms", args.upstream_tbt_ms, 5.0)):
            if value != default:
                command += f" {flag} {value:g}" if isinstance(value, float) else f" {flag} {value}"
    command += " --write-docs" if args.write_docs else ""
    today = time.strftime("%Y-%m-%d")

    out = dict(last)  # parts not run this time keep their last results
    started = machine_facts()
    if "accuracy" in parts:
        print("accuracy on held-out pairs ...", file=sys.stderr)
        out["accuracy"] = accuracy()
        print("embedding latency ...", file=sys.stderr)
        out["embedding"] = embedding_latency()
        out["command"], out["when"] = command, today
    if "scales" in parts:
        out["scales"] = scale.run([s.strip() for s in args.scales.split(",") if s.strip()], versions)
        out["scales_command"], out["scales_when"] = command, today
        out.pop("scales_note", None)  # a note on an earlier, interrupted run
    if "errbound" in parts:
        print("error-bounded hits on the labelled pairs ...", file=sys.stderr)
        out["errbound"] = errbound.run() | {"command": command, "when": today}
    if "e2e" in parts:
        e2e = run_e2e(args.e2e_requests, stores, args.upstream_ttft_ms, args.upstream_tbt_ms)
        e2e["command"] = command
        out["e2e"] = e2e
    ended = machine_facts()
    out.pop("machine", None)  # one snapshot for every part (before 2026-11-26): it named the last part's machine
    out["machines"] = out.get("machines", {}) | {p: {"start": started, "end": ended} for p in parts}
    results_file.parent.mkdir(parents=True, exist_ok=True)
    results_file.write_text(json.dumps(out, indent=1) + "\n")
    missing = [k for k in ("accuracy", "embedding", "scales") if k not in out]
    if missing:
        print(json.dumps({k: out[k] for k in parts if k in out}, indent=1))
        if args.write_docs:
            sys.exit(f"--write-docs needs every part's results ({', '.join(missing)} missing): run them once")
        return
    section = render(out)
    print(section)
    if args.write_docs:
        write_docs(section)


if __name__ == "__main__":
    main()
