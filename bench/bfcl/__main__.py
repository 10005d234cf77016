"""bench/bfcl: tool calling on the real edge model, scored by BFCL's own checker.

    .venv/bin/python -m bench.bfcl [--n 30] [--categories simple_python,multiple,parallel,irrelevance] [--no-docs]
    .venv/bin/python -m bench.bfcl --render bench/results/bfcl.json

1. Fetches the pinned `bfcl-eval` wheel's data and checker (cases.py, checker.py).
2. Starts `edge-node serve --model smollm2-135m-instruct` (the real SmolLM2-135M-Instruct, Q4_1).
3. Sends the first N cases of each category as OpenAI chat requests with their functions as tools, greedy, in
   two modes side by side: `tool_choice: auto` (what agents and SDKs send when tools are bound; the edge's
   grammar lets the model choose text or calls) and `tool_choice: required` (a call is forced; the mode an
   application picks when it knows a call is wanted). `parallel_tool_calls` stays on (the OpenAI default).
4. Scores every answer with BFCL's AST checker (irrelevance: right when nothing is called) and writes
   bench/results/bfcl.json and the "## Tool calling (bench/bfcl)" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.bfcl.cases import BFCL_VERSION, CATEGORIES, Case, load_cases
from bench.bfcl.checker import check
from bench.procs import Server, free_port, peak_rss_mib
from bench.report import REPO, RESULTS, machine_facts, machine_line, write_section

SECTION = "## Tool calling (bench/bfcl)"
EDGE_ARGS = ["--threads", "2", "--parallel", "1", "--ctx", "4096"]
MODES = ("auto", "required")


def ask(url: str, case: Case, mode: str, max_tokens: int) -> dict[str, Any]:
    """One case in one mode: the calls made (`[{name: arguments}]`), the text, status and time."""
    body = {"model": "edge", "messages": case.messages, "tools": case.tools(), "tool_choice": mode,
            "max_tokens": max_tokens, "temperature": 0}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=600) as resp:
            answer = json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return {"status": e.code, "error": e.read().decode(errors="replace")[:300], "calls": [], "text": "",
                "s": round(time.perf_counter() - t0, 3)}
    msg = answer["choices"][0]["message"]
    calls = []
    for call in msg.get("tool_calls") or ():
        try:
            args = json.loads(call["function"]["arguments"])
        except json.JSONDecodeError:
            args = {"<unparsable>": call["function"]["arguments"]}
        calls.append({call["function"]["name"]: args})
    return {"status": 200, "calls": calls, "text": (msg.get("content") or "")[:300],
            "finish_reason": answer["choices"][0].get("finish_reason"),
            "completion_tokens": answer.get("usage", {}).get("completion_tokens"),
            "s": round(time.perf_counter() - t0, 3)}


def run(cases: list[Case], max_tokens: int) -> tuple[dict[str, list[dict[str, Any]]], float]:
    port = free_port()
    RESULTS.mkdir(parents=True, exist_ok=True)
    log = RESULTS / "bfcl-edge.log"
    edge = Server("edge-node", [str(Path(sys.executable).parent / "edge-node"), "serve", "--model",
                                "smollm2-135m-instruct", *EDGE_ARGS, "--port", str(port)],
                  f"http://127.0.0.1:{port}/health", log=log).start()
    url = f"http://127.0.0.1:{port}"
    out: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    try:
        t0 = time.monotonic()
        for i, case in enumerate(cases, 1):
            for mode in MODES:
                if mode == "required" and case.answer is None:
                    continue  # irrelevance: forcing a call makes every answer wrong by construction
                got = ask(url, case, mode, max_tokens)
                verdict = check(case, got["calls"]) if got["status"] == 200 else None
                out[mode].append({"id": case.id, "category": case.category, **got,
                                  "right": bool(verdict and verdict.right), "why": verdict.why if verdict else
                                  f"HTTP {got['status']}"})
            if i % 10 == 0 or i == len(cases):
                print(f"  {i}/{len(cases)} cases ({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
        rss = peak_rss_mib(edge.pid)
    finally:
        edge.stop()
    log.unlink(missing_ok=True)
    return out, rss


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by: dict[str, dict[str, Any]] = {}
    for cat in dict.fromkeys(r["category"] for r in rows):
        mine = [r for r in rows if r["category"] == cat]
        secs = sorted(r["s"] for r in mine)
        by[cat] = {"n": len(mine), "right": sum(r["right"] for r in mine),
                   "accuracy": round(sum(r["right"] for r in mine) / len(mine), 4),
                   "with_calls": sum(bool(r["calls"]) for r in mine),
                   "non_200": sum(r["status"] != 200 for r in mine), "p50_s": secs[len(secs) // 2]}
    return by


def markdown(res: dict[str, Any], path: Path) -> str:
    cats = list(dict.fromkeys(c for m in MODES for c in res["summary"][m]))
    lines = [SECTION, "",
             f"BFCL v4 ({res['bfcl']}, Apache-2.0), the first {res['settings']['n']} cases of each category, "
             f"scored by BFCL's own AST checker; edge node `{res['edge']['model']}` "
             f"(`{res['edge']['args']}`), greedy, max_tokens {res['settings']['max_tokens']}. "
             f"Result file `{res['result_file']}`; command `{res['command']}`. "
             f"Edge node peak RSS {res['edge']['peak_rss_mib']} MiB; {res['wall_s']} s in all. "
             + machine_line(res["machine"]["start"], res["machine"]["end"]), "",
             "| category | auto: right | auto: answers with a call | required: right | auto p50 s | required p50 s |",
             "|---|---|---|---|---|---|"]
    for c in cats:
        a, r = res["summary"]["auto"].get(c), res["summary"]["required"].get(c)
        cell = (lambda s: f"{s['right']}/{s['n']} ({100 * s['accuracy']:.0f} %)" if s else "n/a (a call is forced)")
        calls = f"{a['with_calls']}/{a['n']}" if a and "with_calls" in a else "-"
        lines.append(f"| {c} | {cell(a)} | {calls} | {cell(r)} | {a['p50_s'] if a else '-'} | "
                     f"{r['p50_s'] if r else '-'} |")
    failed = [f"{m} {c}: {s['non_200']}" for m in MODES for c, s in res["summary"][m].items() if s["non_200"]]
    auto = res["summary"]["auto"]
    called, asked = sum(v.get("with_calls", 0) for v in auto.values()), sum(v["n"] for v in auto.values())
    lines += ["", "Answers that were not a 200: " + (", ".join(failed) if failed else "none.") + f" In `auto`, "
              f"{called} of {asked} answers called a tool"
              + (" (so the irrelevance row says nothing about judgement)." if called == 0 else "."),
              "", res["notes"]]
    return "\n".join(lines) + "\n"


NOTES = ("In `auto` the grammar allows text or calls and the model's own choice is measured; `required` forces "
         "calls: one, or with `parallel_tool_calls` (on here) a JSON array of several, which BFCL's parallel cases "
         "need. "
         "What it says: the grammar makes every call parse and name a real function, so what is measured is the "
         "model's choice of function and argument values. A 135M-parameter model is far below the leaderboard's "
         "models; the table is a floor for the edge tier and the comparison a user makes between letting the model "
         "choose (`auto`) and forcing a call (`required`). Irrelevance is scored in `auto` only (forcing a call "
         "makes every answer wrong by construction).")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.bfcl", description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=30, help="cases per category")
    ap.add_argument("--categories", default=",".join(CATEGORIES))
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--out", type=Path, default=RESULTS / "bfcl.json")
    ap.add_argument("--no-docs", action="store_true")
    ap.add_argument("--render", type=Path, metavar="RESULT_JSON", help="only re-render from an earlier result")
    args = ap.parse_args(argv)
    if args.render:
        res = json.loads(args.render.read_text())
        text = markdown(res, args.render)
    else:
        t0, start = time.monotonic(), machine_facts()
        cases = [c for cat in args.categories.split(",") for c in load_cases(cat.strip(), args.n)]
        print(f"{len(cases)} cases", file=sys.stderr)
        rows, rss = run(cases, args.max_tokens)
        cmd = "python -m bench.bfcl" + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()
        res = {"command": ".venv/bin/" + cmd, "date": datetime.now(UTC).isoformat(timespec="seconds"),
               "bfcl": f"bfcl-eval {BFCL_VERSION}", "wall_s": round(time.monotonic() - t0, 1),
               "result_file": str(args.out.relative_to(REPO)) if args.out.is_relative_to(REPO) else str(args.out),
               "machine": {"start": start, "end": machine_facts()},
               "edge": {"model": "smollm2-135m-instruct (SmolLM2-135M-Instruct Q4_1)", "args": " ".join(EDGE_ARGS),
                        "peak_rss_mib": round(rss, 1)},
               "settings": {"n": args.n, "max_tokens": args.max_tokens, "modes": list(MODES)},
               "summary": {m: summary(rows[m]) for m in MODES}, "notes": NOTES, "answers": rows}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=1) + "\n")
        text = markdown(res, args.out)
    print(text)
    if not args.no_docs:
        write_section(SECTION, text)


if __name__ == "__main__":
    main()
