"""bench/flywheel: captured cloud answers become an edge adapter, measured through the product, round by round.

    .venv/bin/python -m bench.flywheel [--rounds 0,500,2000] [--quick] [--no-docs]

1. Starts the stack (stack.py): a real gateway on policies/examples/cascade.yaml with distillation capture on,
   two real SmolLM2-135M-Instruct Q4_1 edge nodes, and a cloud stand-in that answers from the gold answer.
2. For each round N (cumulative): sends the training questions up to N through the gateway as the opted-in
   tenant (the cloud answers, the gateway records), exports them (`tiergate distill export`), trains an adapter
   (`tiergate distill train`: LoRA on the packaged GGUF, converted to a GGUF adapter), gates it (`tiergate distill
   gate`, on the train's held-out slice and a fixed regression set), copies it into the nodes' `--lora-dir` and
   rolls it out (`tiergate distill rollout`: one canary node, probe questions, promote or roll back) while a
   steady stream of requests runs through the gateway's cascade rule; in the last round a deliberately worse
   adapter (trained on shuffled answers) is rolled out after it and must be rolled back.
3. Measures the held-out questions (bench/families.py: values and phrasings never trained on) and the regression
   set through the gateway with what the nodes then serve; round 0 is the packaged model.
4. Writes bench/results/flywheel.json and the "## Distillation flywheel (bench/flywheel)" section of
   docs/benchmarks.md (report.py).

Round N = 0 is the packaged model. Training, gating and conversion run as the operator runs them, as child
processes; their wall time, CPU seconds (getrusage of the waited children) and peak RSS (VmHWM of the process
tree, sampled) are recorded. The machine is shared: wall times are measured under contention.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import httpx

from bench.cascade.tasks import Item, make_items
from bench.families import Question, heldout, training_stream
from bench.flywheel.measure import cascade_numbers, measure
from bench.flywheel.report import SECTION, markdown
from bench.flywheel.stack import KEYS, Stack, stack
from bench.procs import tree_peak_rss_mib
from bench.report import REPO, RESULTS, machine_facts, write_section
from tiergate.core.paths import tiergate_home
from tiergate.edge_node.model.packaged import packaged_path

REGRESSION_TASKS = ("country", "mul_1d")  # bench/cascade's tasks outside the families (no family asks them)


def _say(msg: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {msg}", file=sys.stderr, flush=True)


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_cli(args: list[str], log: Path) -> dict:
    """`tiergate distill ...` as a child process: exit status, last stdout line, wall, CPU seconds, peak RSS."""
    cpu0, t0 = _children_cpu(), time.monotonic()
    with log.open("ab") as err:
        proc = subprocess.Popen([sys.executable, "-m", "tiergate.gateway.cli", "distill", *args],
                                stdout=subprocess.PIPE, stderr=err, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        peak = 0.0
        done = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.wait(0.5):
                peak = max(peak, *tree_peak_rss_mib(proc.pid).values(), 0.0)

        t = threading.Thread(target=sample, daemon=True)
        t.start()
        out, _ = proc.communicate()
        done.set()
        t.join()
    lines = out.decode().strip().splitlines()
    return {"rc": proc.returncode, "stdout": lines[-1] if lines else "", "wall_s": round(time.monotonic() - t0, 1),
            "cpu_s": round(_children_cpu() - cpu0, 1), "peak_rss_mib": round(peak, 1)}


def _post(client: httpx.Client, url: str, key: str, prompt: str, max_tokens: int) -> httpx.Response:
    return client.post(url + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, json={
        "model": "auto", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
        "temperature": 0})


def capture(st: Stack, questions: list[Question], concurrency: int = 8) -> dict:
    """Send the training questions as the opted-in tenant; wait until the gateway has recorded every answer."""
    before = st.recorded()
    codes: Counter[int] = Counter()
    with httpx.Client(timeout=120) as client, ThreadPoolExecutor(concurrency) as pool:
        for r in pool.map(lambda q: _post(client, st.url, KEYS["acme"], q.prompt, 64), questions):
            codes[r.status_code] += 1
    deadline = time.monotonic() + 120
    while st.recorded() - before < codes[200] and time.monotonic() < deadline:
        time.sleep(0.2)
    return {"sent": len(questions), "status": dict(codes), "recorded": st.recorded() - before}


class Load:
    """A steady stream of requests through the gateway's cascade rule while a rollout runs; counts every outcome."""

    def __init__(self, url: str, questions: list[Question], workers: int = 2, max_tokens: int = 24) -> None:
        self.url, self.questions, self.max_tokens = url, questions, max_tokens
        self.stop = threading.Event()
        self.counts: Counter[str] = Counter()
        self.tiers: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(workers)]

    def _run(self, i: int) -> None:
        rng = random.Random(i)
        with httpx.Client(timeout=300) as client:
            while not self.stop.is_set():
                q = rng.choice(self.questions)
                try:
                    r = _post(client, self.url, KEYS["load"], q.prompt, self.max_tokens)
                    explicit = r.status_code == 200 or "error" in (r.json() if r.content else {})
                    kind = "ok" if r.status_code == 200 else ("error" if explicit else "lost")
                    tier = r.headers.get("x-tiergate-tier", "?")
                except (httpx.HTTPError, ValueError):
                    kind, tier = "lost", "?"
                with self.lock:
                    self.counts[kind] += 1
                    if kind == "ok":
                        self.tiers[tier] += 1

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(600)

    def result(self) -> dict:
        return {"requests": sum(self.counts.values()), "ok_200": self.counts["ok"],
                "explicit_errors": self.counts["error"], "lost": self.counts["lost"], "answered_by": dict(self.tiers)}


def _swap(node: str, adapter: str | None) -> None:
    r = httpx.post(node + "/admin/lora", json={"adapter": adapter}, timeout=600)
    r.raise_for_status()


def _lora(node: str) -> str | None:
    return httpx.get(node + "/health", timeout=30).json().get("lora")


def _jsonl(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": p},
                                                     {"role": "assistant", "content": a}]}) + "\n" for p, a in rows))
    return path


def _sample_lines(src: Path, dst: Path, n: int, seed: int) -> Path:
    lines = [ln for ln in src.read_text().splitlines() if ln.strip()]
    dst.write_text("".join(x + "\n" for x in random.Random(seed).sample(lines, min(n, len(lines)))))
    return dst


def _shuffled_answers(export: Path, dst: Path, seed: int) -> Path:
    """The export with every answer moved to another question: a candidate trained on it is deliberately worse."""
    rows = [json.loads(x) for x in export.read_text().splitlines() if x.strip()]
    answers = [r["messages"][-1]["content"] for r in rows]
    random.Random(seed).shuffle(answers)
    for r, a in zip(rows, answers, strict=True):
        r["messages"][-1]["content"] = a
    dst.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return dst


def _steps(args: argparse.Namespace, examples: int) -> list[str]:
    """`--steps` for the train: 3 in a quick run, else --max-steps where an epoch's share would take more."""
    if args.quick:
        return ["--steps", "3"]
    full = round(-(-examples * 0.85 // args.batch_size) * args.epochs)  # rows left after the held-out slice
    return ["--steps", str(args.max_steps)] if args.max_steps and args.max_steps < full else []


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.flywheel", description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", default="0,500,2000", help="captured answers per round, cumulative (0: the base)")
    ap.add_argument("--quick", action="store_true", help="a few-minute smoke run: tiny rounds, a few steps")
    ap.add_argument("--heldout-per-family", type=int, default=40)
    ap.add_argument("--regression-per-task", type=int, default=20)
    ap.add_argument("--gate-rows", type=int, default=40, help="rows of the train's held-out slice the gate scores")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--margin", type=float, default=5.0, help="points the gate and the canary must gain")
    ap.add_argument("--max-steps", type=int, default=None,
                    help="cap each round's optimizer steps (a shared machine's time limit); the table shows steps")
    ap.add_argument("--bad-steps", type=int, default=10, help="steps of the deliberately worse candidate")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--work", type=Path, default=tiergate_home() / "flywheel")
    ap.add_argument("--no-docs", action="store_true")
    ap.add_argument("--render", type=Path, metavar="RESULT_JSON", help="only re-render an earlier run's tables")
    args = ap.parse_args(argv)
    if args.render:
        _publish(json.loads(args.render.read_text()), args.render, args.no_docs)
        return
    if args.quick:
        if args.rounds == ap.get_default("rounds"):
            args.rounds = "0,60"
        args.heldout_per_family, args.regression_per_task, args.gate_rows, args.bad_steps = 4, 3, 6, 2
    out_path = args.out or RESULTS / ("flywheel-quick.json" if args.quick else "flywheel.json")
    rounds = [int(x) for x in args.rounds.split(",")]
    t_start = time.monotonic()
    work = args.work / ("quick" if args.quick else "full")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    log = work / "cli.log"
    model = packaged_path("smollm2-135m-instruct")

    held = heldout(args.heldout_per_family, args.seed)
    regression: list[Item] = make_items({t: args.regression_per_task for t in REGRESSION_TASKS}, args.seed)
    stream = training_stream(max(rounds), args.seed)
    reg_file = _jsonl(work / "regression.jsonl", [(it.prompt, it.gold) for it in regression])
    machine = machine_facts()
    _say(f"{len(held)} held-out questions, {len(regression)} regression questions, rounds {rounds}")

    results: list[dict] = []
    sent = 0
    with stack(work, [*stream, *held], work) as st:
        _say(f"stack up: gateway {st.url}, nodes {st.node_urls}")
        for k, n in enumerate(rounds):
            final = k == len(rounds) - 1
            rnd: dict = {"captured_target": n}
            if n > 0:
                _say(f"round {n}: capturing {n - sent} answers through the gateway")
                rnd["capture"] = capture(st, stream[sent:n])
                sent = n
                export = work / f"export-{n}.jsonl"
                ex = run_cli(["export", "--out", str(export), "--file", str(st.records), "--tenant", "acme",
                              "--force"], log)
                rnd["export"] = {"rc": ex["rc"], "examples": json.loads(ex["stdout"] or "{}").get("examples")}
                run = work / f"run-{n}"
                train_args = [str(export), "--model", str(model), "--out", str(run), "--epochs", str(args.epochs),
                              "--rank", str(args.rank), "--lr", str(args.lr), "--batch-size", str(args.batch_size),
                              "--threads", str(args.threads), "--heldout-share", "0.1", "--newest-share", "0.05",
                              "--no-resume", *_steps(args, rnd["export"]["examples"] or 0)]
                _say(f"round {n}: training on {rnd['export']['examples']} captured answers")
                tr = run_cli(["train", *train_args], log)
                if tr["rc"] != 0:
                    raise SystemExit(f"training failed ({tr['rc']}); see {log}")
                manifest = json.loads((run / "adapter.gguf.manifest.json").read_text())
                adapter = run / "adapter.gguf"
                rnd["train"] = {**{k2: tr[k2] for k2 in ("wall_s", "cpu_s", "peak_rss_mib")},
                                "rows": manifest["data"], "steps": manifest["training"].get("steps"),
                                "params": {k2: manifest["training"].get(k2) for k2 in
                                           ("rank", "alpha", "lr", "epochs", "batch_size", "threads", "max_len")},
                                "adapter_bytes": adapter.stat().st_size}
                probes = _sample_lines(run / "heldout.jsonl", work / f"probes-{n}.jsonl", args.gate_rows, args.seed)
                _say(f"round {n}: gating")
                verdict_path = work / f"verdict-{n}.json"
                gt = run_cli(["gate", "--model", str(model), "--adapter", str(adapter), "--heldout", str(probes),
                              "--regression", str(reg_file), "--out", str(verdict_path), "--margin",
                              str(args.margin), "--max-regression", "2", "--max-tokens", str(args.max_tokens)], log)
                verdict = json.loads(verdict_path.read_text()) if verdict_path.exists() else {}
                rnd["gate"] = {"rc": gt["rc"], "wall_s": gt["wall_s"], "cpu_s": gt["cpu_s"],
                               "promote": verdict.get("promote"), "reason": verdict.get("reason"),
                               "heldout": verdict.get("heldout"), "regression": verdict.get("regression")}
                rnd["pipeline_wall_s"] = round(tr["wall_s"] + gt["wall_s"], 1)
                name = f"r{n}.gguf"
                shutil.copy(adapter, st.lora_dir / name)
                previous = _lora(st.node_urls[0])
                bad_name = None
                if final:
                    _say(f"round {n}: training the deliberately worse candidate ({args.bad_steps} steps)")
                    bad_export = _shuffled_answers(export, work / "export-shuffled.jsonl", args.seed)
                    bad = run_cli(["train", str(bad_export), "--model", str(model), "--out", str(work / "run-bad"),
                                   "--steps", str(args.bad_steps), "--lr", "0.003", "--batch-size", "8",
                                   "--threads", str(args.threads), "--no-resume"], log)
                    if bad["rc"] == 0:
                        bad_name = "worse.gguf"
                        shutil.copy(work / "run-bad" / "adapter.gguf", st.lora_dir / bad_name)
                _say(f"round {n}: rolling out {name} under load")
                with Load(st.url, held) as load:
                    ro = run_cli(["rollout", *[f"--node={u}" for u in st.node_urls], "--adapter", name,
                                  "--probes", str(probes), "--canary", "1", "--margin", str(args.margin),
                                  "--max-tokens", str(args.max_tokens),
                                  *(["--previous", previous] if previous else [])], log)
                    rnd["rollout"] = {"rc": ro["rc"], "wall_s": ro["wall_s"],
                                      **json.loads(ro["stdout"] or "{}")}
                    if bad_name is not None:
                        _say(f"round {n}: rolling out the worse candidate under load")
                        prev = _lora(st.node_urls[0])
                        wr = run_cli(["rollout", *[f"--node={u}" for u in st.node_urls], "--adapter", bad_name,
                                      "--probes", str(probes), "--canary", "1", "--margin", str(args.margin),
                                      "--max-tokens", str(args.max_tokens), *(["--previous", prev] if prev else [])],
                                     log)
                        rnd["worse_candidate"] = {"rc": wr["rc"], "wall_s": wr["wall_s"], "steps": args.bad_steps,
                                                  "trained_on": "the same export with answers shuffled between "
                                                                "questions", **json.loads(wr["stdout"] or "{}"),
                                                  "nodes_after": [_lora(u) for u in st.node_urls]}
                    load_after = {"nodes_after": [_lora(u) for u in st.node_urls]}
                rnd["load_during_rollout"] = {**load.result(), **load_after}
                forced = [u for u in st.node_urls if _lora(u) != name]
                for u in forced:  # measure the candidate even when the rollout kept it off a node
                    _swap(u, name)
                rnd["measured_with_forced_swap"] = len(forced)
            _say(f"round {n}: measuring {len(held)} held-out and {len(regression)} regression questions")
            pids = [node.pid for node in st.nodes]
            m_held = measure(st.url, KEYS["probe"], held, pids, args.max_tokens)
            m_reg = measure(st.url, KEYS["probe"], regression, pids, args.max_tokens)
            rnd["adapter_served"] = [_lora(u) for u in st.node_urls]
            rnd["heldout"] = cascade_numbers([q.task for q in held], m_held, args.seed)
            rnd["regression"] = {"n": len(regression), "accuracy": round(float(m_reg.right.mean()), 4)}
            rnd["examples"] = [{"prompt": q.prompt, "gold": q.gold, "answer": a.text[:100], "right": bool(r)}
                               for q, a, r in list(zip(held, m_held.answers, m_held.right, strict=True))[::4]]
            results.append(rnd)
            _say(f"round {n}: held-out accuracy {rnd['heldout']['accuracy']}, kept at 5 % "
                 f"{rnd['heldout']['cascade']['5pct']['kept']}, regression {rnd['regression']['accuracy']}")
            _write(out_path, args, argv, machine, rounds, results, t_start, held, regression, st, partial=not final)
    _publish(json.loads(out_path.read_text()), out_path, args.no_docs or args.quick)


def _write(out_path: Path, args: argparse.Namespace, argv: list[str] | None, machine: dict, rounds: list[int],
           results: list[dict], t_start: float, held: list[Question], regression: list[Item], st: Stack,
           partial: bool) -> None:
    cmd = "python -m bench.flywheel" + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()
    body = {
        "command": ".venv/bin/" + cmd, "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "complete": not partial, "wall_s": round(time.monotonic() - t_start, 1),
        "result_file": str(out_path.relative_to(REPO)) if out_path.is_relative_to(REPO) else str(out_path),
        "machine": {**machine, "load_now": round(os.getloadavg()[0], 2)},
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "render"},
        "edge": "two `edge-node serve --model smollm2-135m-instruct --threads 1 --parallel 2 --ctx 1024` "
                "(SmolLM2-135M-Instruct Q4_1, the packaged model)",
        "heldout": {"n": len(held), "by_family": dict(Counter(q.task for q in held)),
                    "unseen_phrasing_share": round(sum(q.phrasing >= 4 for q in held) / max(len(held), 1), 3)},
        "regression": {"n": len(regression), "tasks": list(REGRESSION_TASKS),
                       "source": "bench/cascade/tasks.py (country from capital, one-digit products), checked by "
                                 "bench/cascade/check.py"},
        "cloud_standin_calls": st.cloud.calls,
        "rounds": results,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(body, indent=1) + "\n")


def _publish(res: dict, path: Path, no_docs: bool) -> None:
    text = markdown(res)
    print(text)
    if not no_docs:
        write_section(SECTION, text)
        print(f"tables from {path} written to the '{SECTION}' section of docs/benchmarks.md", file=sys.stderr)


if __name__ == "__main__":
    main()
