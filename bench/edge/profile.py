"""Where edge-node's time goes under load: a py-spy profile of the server during one bench/edge round.

    .venv/bin/python -m bench.edge.profile [--model demo] [--streams 16] [--tokens 128] [--gil]

Starts `edge-node serve` as bench/edge does, sends one round (`--streams` concurrent streaming requests), and
samples the server's Python stacks with py-spy (installed into its own virtualenv by bench/anchors.py at the
pinned version). Samples are grouped by what they were doing: `llama_decode` (the model itself, in C), sampling
(llama.cpp's sampler chain), detokenising and stop strings, handing chunks to the event loop, the rest of the
engine thread's Python, and the event loop thread (HTTP, JSON, SSE; "uvloop" is its C core: sockets, callbacks).
`--gil` samples only the thread holding the GIL, which shows what the engine waits for between two decodes.
Writes bench/results/edge-profile-MODEL-STREAMS.json and prints the breakdown.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.anchors import ensure_venv
from bench.edge.client import run_round
from bench.edge.servers import MODELS, banned_tokens, base_url, make_servers, resolve_model
from bench.report import REPO, RESULTS, machine_facts
from bench.versions import PY_SPY, TOOLS_VENV

__all__ = ["categorise"]

# (category, predicate on the innermost frames), first match wins; frames look like "func (file.py:line)".
_RULES = (
    ("sampling (C sampler chain)", lambda fs: any("SamplerChain.sample" in f for f in fs)),
    ("detokenise, stop strings", lambda fs: any(k in f for f in fs for k in ("LlamaRuntime.piece", "TextStream",
                                                                               "textstream.py"))),
    ("hand-off to the event loop", lambda fs: any(k in f for f in fs for k in ("LoopHandoff", "Handoffs.", "_put_all"))),
    ("log-probabilities", lambda fs: any("LogprobReader" in f for f in fs)),
)
def _decode_line() -> str:
    """The frame py-spy shows while the engine is inside llama_decode (the call's line in edge_node/engine/batch.py)."""
    lines = (REPO / "edge_node" / "engine" / "batch.py").read_text().splitlines()
    n = next(i for i, ln in enumerate(lines, 1) if "llama_decode(" in ln and "rc =" in ln)
    return f"DecodeStep.run (edge_node/engine/batch.py:{n})"


def categorise(raw: str, decode_frame: str) -> dict[str, int]:
    """py-spy's raw (collapsed) output → samples per category."""
    out: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        if not line.strip():
            continue
        stack, count = line.rsplit(" ", 1)
        frames = stack.split(";")
        thread, fs = frames[0], frames[1:] or [""]
        if "edge-engine" not in thread:
            out["event loop: uvloop (C)" if fs[-1].startswith("Runner.run") or fs[-1].startswith("run (uvicorn")
                else "event loop: HTTP, JSON, SSE (Python)"] += int(count)
            continue
        cat = "llama_decode (C)" if fs[-1] == decode_frame else next(
            (name for name, pred in _RULES if pred(fs)), "engine: other Python (batch build, bookkeeping)")
        out[cat] += int(count)
    return dict(out.most_common())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="demo", choices=list(MODELS))
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--gil", action="store_true", help="sample only the thread holding the GIL")
    args = ap.parse_args()
    spy = ensure_venv(TOOLS_VENV, f"py-spy=={PY_SPY}", log=lambda m: print(m, file=sys.stderr)) / "py-spy"
    model = resolve_model(args.model)
    banned = banned_tokens(model)
    tmp = Path(tempfile.mkdtemp(prefix="tg-edge-profile-"))
    edge = make_servers(model, MODELS[args.model], Path("-"), Path("-"), 16, 1024, tmp)[0]
    before = machine_facts()
    edge.start(timeout_s=300)
    try:
        run_round(base_url(edge), 2, 1, 8, banned, offset=10_000)  # warm-up
        raw = tmp / "py-spy.txt"
        proc = subprocess.Popen([str(spy), "record", "-p", str(edge.pid), "-r", "250", "-f", "raw", "-o", str(raw),
                                 "--threads", "--nonblocking", *(["--gil"] if args.gil else [])],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)
        reqs, wall = run_round(base_url(edge), args.streams, 1, args.tokens, banned, offset=0)
        proc.send_signal(2)
        proc.wait(60)
    finally:
        edge.stop()
    cats = categorise(raw.read_text(), _decode_line())
    total = sum(cats.values())
    tokens = sum(r.tokens for r in reqs)
    report = {"command": "python -m bench." + " ".join(["edge.profile", *sys.argv[1:]]), "model": args.model,
              "streams": args.streams, "tokens": tokens, "wall_s": wall, "tok_s": tokens / wall, "gil_only": args.gil,
              "samples": cats, "machine_before": before, "machine_after": machine_facts()}
    out = RESULTS / f"edge-profile-{args.model}-{args.streams}{'-gil' if args.gil else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"{args.model}, {args.streams} streams: {tokens / wall:.0f} tokens/s; py-spy samples ({total}):")
    for name, n in cats.items():
        print(f"  {n / total:6.1%}  {name}")


if __name__ == "__main__":
    main()
