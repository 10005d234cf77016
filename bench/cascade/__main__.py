"""bench/cascade: a confidence cascade from edge to cloud, measured on the real edge model's real answers.

    .venv/bin/python -m bench.cascade [--n N] [--tasks capital,add_1d,...] [--max-tokens 16] [--seed 0]
                                      [--stand-in] [--no-docs]

1. Starts `edge-node serve --model smollm2-135m-instruct --threads 1 --parallel 2 --ctx 2048` (the real
   SmolLM2-135M-Instruct, Q4_1, from its pinned PyPI package).
2. Asks it every question of bench/cascade/tasks.py (graded arithmetic, capitals both ways, MMLU as the
   no-signal control), streamed and greedy, one at a time, and checks each answer exactly (check.py).
3. Computes the keep scores (signals.py: policies/confidence.py on the answer's token log-probabilities,
   policies/classify.py's Classifier on the prompt), and measures a few questions again with max_tokens = k
   (the CPU an escalated first-k attempt really costs).
4. With `--stand-in`, also asks the cloud stand-in (vLLM, the same model in float32) for the second view.
5. analysis.py turns it into numbers; report.py into tables: printed, written to bench/results/cascade.json
   and to the "## Cascade (bench/cascade)" section of docs/benchmarks.md (unless --no-docs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from bench.cascade.analysis import analyse
from bench.cascade.check import first_letter
from bench.cascade.report import SECTION, markdown
from bench.cascade.runner import Answer, ask, ask_all
from bench.cascade.signals import FIRST_K, answer_signals, prompt_features
from bench.cascade.tasks import DEFAULT_N, MMLU_FILE, TASKS, Item, make_items
from bench.procs import Server, free_port, peak_rss_mib
from bench.report import REPO, RESULTS, write_section

EDGE_ARGS = ["--threads", "1", "--parallel", "2", "--ctx", "2048"]
FIRST_K_SAMPLE = 5  # questions per task measured again with max_tokens = k


def _machine() -> dict:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "?")
    mem = next((int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines()
                if ln.startswith("MemTotal:")), 0) if Path("/proc/meminfo").exists() else 0
    return {"cpu_model": model, "cores": os.cpu_count(), "mem_gib": round(mem / 2**20, 1),
            "python": platform.python_version(), "load_start": round(os.getloadavg()[0], 2)}


def _progress(total: int, label: str) -> callable:
    t0 = time.monotonic()

    def show(k: int) -> None:
        if k % 50 == 0 or k == total:
            print(f"  {label}: {k}/{total} ({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
    return show


def _first_k_attempts(url: str, pid: int, items: list[Item], answers: list[Answer]) -> dict[int, dict]:
    """CPU and wall time of a real first-k attempt (max_tokens = k) on a few questions per task."""
    picked = [i for task in dict.fromkeys(it.task for it in items)
              for i in [j for j, it in enumerate(items) if it.task == task][:FIRST_K_SAMPLE]]
    out = {}
    for k in FIRST_K:
        runs = [ask(url, items[i].prompt, k, pid) for i in picked]
        est = [answers[i].cpu_s * min(1.0, (answers[i].token_times[k - 1] if len(answers[i].token_times) >= k
                                            else answers[i].done_s) / max(answers[i].done_s, 1e-9)) for i in picked]
        out[k] = {"n": len(picked), "cpu_s_mean": round(float(np.mean([r.cpu_s for r in runs])), 4),
                  "wall_s_mean": round(float(np.mean([r.done_s for r in runs])), 4),
                  "estimated_cpu_s_mean": round(float(np.mean(est)), 4)}
    return out


def _item_record(it: Item, a: Answer, right: bool, sig: dict[str, float], prompt_tokens: int,
                 complexity: float) -> dict:
    def r(x: float) -> float | None:
        return None if not np.isfinite(x) else round(float(x), 4)
    return {"id": it.id, "task": it.task, "gold": it.gold, "answer": a.text, "right": right,
            "finish": a.finish_reason, "tokens": a.completion_tokens, "prompt_tokens": prompt_tokens,
            "complexity": round(complexity, 4), "signals": {k: r(v) for k, v in sig.items()},
            "ttft_s": r(a.token_times[0]) if a.token_times else None, "done_s": round(a.done_s, 4),
            "cpu_s": round(a.cpu_s, 3)}


NOTES = [
    "AUROC answers \"does the signal rank right answers above wrong ones?\"; kept-at-loss and APGR answer "
    "\"how much traffic can stay on the edge?\", which also depends on the mix: with more MMLU (where the edge is "
    "right only by chance) fewer requests can stay, with more capital questions more. The mix here is the task "
    "list above; a deployment should re-derive its thresholds on its own traffic (or a sample of it).",
    "Thresholds are in nats per token (OpenAI `logprobs` units). They are this model's: a different edge model "
    "or quantization needs its own.",
    "Intervals are bootstrap percentiles over the evaluation half's requests; they do not include the variation "
    "from choosing the threshold on the calibration half, which the calibration/evaluation table shows directly.",
]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.cascade", description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=None, help="questions per task (default: per task, see tasks.py)")
    ap.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated, from {', '.join(TASKS)}")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reps", type=int, default=1000, help="bootstrap resamples")
    ap.add_argument("--stand-in", action="store_true", help="also score the vLLM cloud stand-in's own answers")
    ap.add_argument("--out", type=Path, default=RESULTS / "cascade.json")
    ap.add_argument("--no-docs", action="store_true", help="do not rewrite docs/benchmarks.md's section")
    ap.add_argument("--render", type=Path, metavar="RESULT_JSON",
                    help="only re-render the tables (and the docs section) from an earlier run's result file")
    args = ap.parse_args(argv)
    if args.render:
        _publish(json.loads(args.render.read_text()), args.render, args.no_docs)
        return
    t_start = time.monotonic()
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    counts = {t: (args.n if args.n is not None else DEFAULT_N[t]) for t in tasks}
    items = make_items(counts, args.seed)
    machine = _machine()
    print(f"{len(items)} questions ({', '.join(f'{t} {n}' for t, n in counts.items())}); "
          f"load average {machine['load_start']}", file=sys.stderr)

    port = free_port()
    log = RESULTS / "cascade-edge.log"
    RESULTS.mkdir(parents=True, exist_ok=True)
    edge = Server("edge-node", [str(Path(sys.executable).parent / "edge-node"), "serve", "--model",
                                "smollm2-135m-instruct", *EDGE_ARGS, "--port", str(port)],
                  f"http://127.0.0.1:{port}/health", log=log)
    edge.start()
    url = f"http://127.0.0.1:{port}"
    try:
        for it in items[:2]:  # warm-up: first-request costs (allocations, page faults) are not a question's
            ask(url, it.prompt, 4, edge.pid)
        answers = ask_all(url, items, args.max_tokens, edge.pid, 1, _progress(len(items), "edge"))
        machine["load_after_edge_answers"] = round(os.getloadavg()[0], 2)
        first_k = _first_k_attempts(url, edge.pid, items, answers)
        rss = peak_rss_mib(edge.pid)
    finally:
        edge.stop()
    log.unlink(missing_ok=True)

    stand_in_right = None
    if args.stand_in:
        from bench.cascade.standin import stand_in_answers  # imports the cloud pool: only when asked for

        print("  stand-in: starting vLLM", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(prefix="tiergate-cascade-standin-") as tmp:
            si = stand_in_answers(items, args.max_tokens, Path(tmp))
        stand_in_right = np.array([it.check(a.text) for it, a in zip(items, si, strict=True)], np.float64)

    right = np.array([it.check(a.text) for it, a in zip(items, answers, strict=True)], np.float64)
    signals = answer_signals(answers)
    raw = answer_signals(answers, cut_rule=False)
    raw = {k: raw[k] for k in ("mean logprob", "min logprob", "mean margin")}
    prompt = prompt_features([it.prompt for it in items])
    res = analyse([it.task for it in items], right, answers, signals, raw, prompt, args.seed, args.reps, first_k,
                  stand_in_right)

    if "mmlu" in res["tasks"]:  # which letters the edge answers: a model that guesses picks one letter
        letters = [first_letter(a.text) for it, a in zip(items, answers, strict=True) if it.task == "mmlu"]
        res["tasks"]["mmlu"]["answer_letter_shares"] = {str(k): round(letters.count(k) / len(letters), 4)
                                                        for k in ("A", "B", "C", "D", None)}
    machine["load_end"] = round(os.getloadavg()[0], 2)
    cmd = "python -m bench.cascade" + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()
    out = {
        "command": ".venv/bin/" + cmd, "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "wall_s": round(time.monotonic() - t_start, 1), "result_file": str(args.out.relative_to(REPO))
        if args.out.is_relative_to(REPO) else str(args.out),
        "machine": machine,
        "edge": {"model": "smollm2-135m-instruct (SmolLM2-135M-Instruct Q4_1)", "args": " ".join(EDGE_ARGS),
                 "peak_rss_mib": round(rss, 1)},
        "settings": {"max_tokens": args.max_tokens, "seed": args.seed, "concurrency": 1, "reps": args.reps,
                     "counts": counts, "stand_in": args.stand_in},
        "data": [
            {"tasks": "sums and products", "source": "generated by bench/cascade/tasks.py from the seed",
             "license": "our own data"},
            {"tasks": "capitals, both directions", "source": "bench/cascade/capitals.py, 144 countries written "
             "for this project from general knowledge", "license": "our own data"},
            {"tasks": "MMLU (control)", "source": f"`../shared/data/routing/{MMLU_FILE.name}`, gold letters from "
             "MMLU-Redux", "license": "CC BY 4.0, LICENSE-mmlu-redux"},
        ],
        **res, "notes": NOTES,
        "items": [_item_record(it, a, bool(r), {k: float(v[i]) for k, v in signals.items()},
                               int(-prompt["prompt tokens"][i]), float(-prompt["complexity"][i]))
                  for i, (it, a, r) in enumerate(zip(items, answers, right, strict=True))],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    _publish(out, args.out, args.no_docs)


def _publish(res: dict, path: Path, no_docs: bool) -> None:
    """Print the tables and write them to docs/benchmarks.md: every number is read from the result `res`."""
    text = markdown(res)
    print(text)
    if not no_docs:
        write_section(SECTION, text)
        print(f"tables from {path} written to the '{SECTION}' section of docs/benchmarks.md", file=sys.stderr)


if __name__ == "__main__":
    main()
