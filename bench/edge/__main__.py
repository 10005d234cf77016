"""bench/edge: edge-node (continuous batching) vs llama-cpp-python's server, same GGUF, same machine, one run.

    .venv/bin/python -m bench.edge [--quant q4_0|q4_k_m] [--tokens 128] [--repeats 3] [--no-docs]

1. Builds the benchmark model once (12 layers, hidden 768, 16k-token BPE vocabulary, INT4 through
   llama.cpp's quantizer) under .tiergate/bench/ (skipped when already there).
2. Starts `edge-node serve --parallel 16` and `python -m llama_cpp.server --interrupt_requests false`
   (its default would cut running streams short when a new request arrives) on the same file, both
   with one llama.cpp thread for generation and for batches (the machine has 2 shared cores).
3. At 1, 4, 8 and 16 concurrent streaming chat requests (`--tokens` output tokens each, temperature
   0.7, top_k 40, min_p 0.05, no repetition penalty, distinct seeds and prompts), alternating servers,
   `--repeats` times: aggregate generated tokens/s (all tokens / wall time of the round), p50 time between
   tokens within a stream, p50 time to first token. The median over repeats is reported.
4. Peak RSS of each server process (psutil samples during the run, and the kernel's VmHWM).

Prints a table with edge/llama-cpp ratios, writes bench/results/edge.json and replaces the
"## Edge node (bench/edge)" section of docs/benchmarks.md (unless --no-docs).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import psutil

from bench.report import write_section

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "benchmarks.md"
RESULTS = REPO / "bench" / "results"
SECTION = "## Edge node (bench/edge)"
CONCURRENCY = (1, 4, 8, 16)
WORDS = ["edge", "gateway", "route", "cloud", "cache", "latency", "token", "stream", "model", "request", "answer", "batch", "prompt", "node", "tenant", "policy", "priority", "quick", "brown", "fox", "garden", "river", "window", "music", "paper", "light", "coffee"]


@dataclass
class Round:
    server: str
    streams: int
    tokens: int
    wall_s: float
    tok_s: float
    tbt_p50_ms: float
    ttft_p50_ms: float
    cpu_ms_per_token: float = float("nan")


@dataclass
class ServerProc:
    name: str
    args: list[str]
    port: int
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    peak_sampled: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, health_path: str, timeout_s: float = 180) -> None:
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT,
                                         env=os.environ | {"HF_HUB_OFFLINE": "1"})
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited with {self.proc.returncode}; see {self.log}")
            try:
                import urllib.request

                with urllib.request.urlopen(self.url + health_path, timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.3)
        else:
            raise SystemExit(f"{self.name} not ready after {timeout_s}s; see {self.log}")
        threading.Thread(target=self._sample_rss, daemon=True).start()

    def _sample_rss(self) -> None:
        p = psutil.Process(self.proc.pid)
        while not self._stop.is_set():
            try:
                self.peak_sampled = max(self.peak_sampled, p.memory_info().rss)
            except psutil.Error:
                return
            time.sleep(0.05)

    def peak_rss_mib(self) -> float:
        """max(psutil samples, VmHWM): the kernel's high-water mark also covers model loading."""
        hwm = 0
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    hwm = int(line.split()[1]) * 1024
        except OSError:
            pass
        return max(hwm, self.peak_sampled) / 2**20

    def cpu_seconds(self) -> float:
        t = psutil.Process(self.proc.pid).cpu_times()
        return t.user + t.system

    def stop(self) -> None:
        self._stop.set()
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def cpu_pressure() -> float | None:
    """Linux PSI: % of the last 10 s in which runnable tasks waited for a CPU (other work on the machine)."""
    try:
        line = Path("/proc/pressure/cpu").read_text().splitlines()[0]
        return float(line.split("avg10=")[1].split()[0])
    except (OSError, IndexError, ValueError):
        return None


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_model(quant: str) -> Path:
    from edge_node.demo_model import build_demo_model

    out = REPO / ".tiergate" / "bench" / quant
    path = out / f"tiergate-demo-bench-{quant}.gguf"
    if not path.exists():
        print(f"building the benchmark model ({quant}) in {out}", file=sys.stderr)
        build_demo_model(out, size="bench", quant=quant, seed=0,  # type: ignore[arg-type]
                         progress=lambda m: print(f"  {m}", file=sys.stderr))
    return path


def prompt(i: int) -> str:
    words = [WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(12)]
    return f"Request {i}: " + " ".join(words) + ". Explain briefly."


async def one_stream(session: aiohttp.ClientSession, url: str, i: int, tokens: int) -> tuple[int, float, list[float]]:
    # The same sampling for both, spelled out: llama_cpp.server would otherwise add its repeat_penalty 1.1
    # (edge-node's default is none), and both default to top_k 40 / min_p 0.05, llama.cpp's defaults.
    body = {"model": "bench", "messages": [{"role": "user", "content": prompt(i)}], "max_tokens": tokens,
            "temperature": 0.7, "top_k": 40, "min_p": 0.05, "seed": 1000 + i, "stream": True,
            "repeat_penalty": 1.0, "repetition_penalty": 1.0}
    t0 = time.perf_counter()
    stamps: list[float] = []
    async with session.post(url + "/v1/chat/completions", json=body) as r:
        if r.status != 200:
            raise SystemExit(f"{url} answered {r.status}: {(await r.text())[:300]}")
        async for raw in r.content:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            d = json.loads(line[6:])
            ch = d.get("choices") or []
            if ch and (ch[0].get("delta") or {}).get("content"):
                stamps.append(time.perf_counter())
    ttft = stamps[0] - t0 if stamps else float("nan")
    return len(stamps), ttft, [b - a for a, b in itertools.pairwise(stamps)]


async def run_round(server: ServerProc, streams: int, tokens: int, offset: int) -> Round:
    timeout = aiohttp.ClientTimeout(total=1800)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=64)) as session:
        cpu0 = server.cpu_seconds()
        t0 = time.perf_counter()
        res = await asyncio.gather(*(one_stream(session, server.url, offset + k, tokens) for k in range(streams)))
        wall = time.perf_counter() - t0
        cpu = server.cpu_seconds() - cpu0
    total = sum(n for n, _, _ in res)
    gaps = [g for _, _, gs in res for g in gs]
    return Round(server.name, streams, total, wall, total / wall,
                 statistics.median(gaps) * 1e3 if gaps else float("nan"),
                 statistics.median(t for _, t, _ in res) * 1e3, cpu / max(total, 1) * 1e3)


async def warm_up(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        await one_stream(session, url, 0, 8)


def kernel_ceiling(model: Path, steps: int = 64) -> dict[int, float]:
    """CPU ms per generated token of bare `llama_decode` calls (one thread) at several batch sizes.

    No sampling, no Python server, no HTTP: what batching can save on this CPU at best. CPU time, not
    wall time, so other work on the machine barely moves it.
    """
    from edge_node.batch import Batch  # the benchmark's parent process never loads llama.cpp
    from edge_node.runtime import LlamaRuntime, RuntimeConfig

    rt = LlamaRuntime(RuntimeConfig(model_path=model, ctx_per_seq=256, parallel=16, check_memory=False))
    ll, b, out = rt.llama, Batch(rt.llama, 64), {}
    try:
        for bs in (1, 4, 8, 16):
            for s in range(16):
                ll.llama_memory_seq_rm(rt.memory, s, -1, -1)
            t0 = time.process_time()
            for p in range(steps):
                b.token[:bs] = 200 + p
                b.pos[:bs] = p
                b.seq[:bs] = range(bs)
                b.logits[:bs] = 1
                b.struct.n_tokens = bs
                if ll.llama_decode(rt.ctx, b.struct) != 0:
                    raise SystemExit("llama_decode failed in the kernel measurement")
            out[bs] = (time.process_time() - t0) / (steps * bs) * 1e3
    finally:
        rt.close()
    return out


def median_round(rounds: list[Round]) -> Round:
    r = sorted(rounds, key=lambda x: x.tok_s)[len(rounds) // 2]
    return Round(r.server, r.streams, r.tokens, r.wall_s, r.tok_s,
                 statistics.median(x.tbt_p50_ms for x in rounds), statistics.median(x.ttft_p50_ms for x in rounds),
                 statistics.median(x.cpu_ms_per_token for x in rounds))


def render(results: dict[int, dict[str, Round]], rss: dict[str, float]) -> str:
    lines = [
        ("| streams | edge-node tok/s | llama_cpp.server tok/s | ratio | edge p50 TBT ms | llama p50 TBT ms "
         "| edge p50 TTFT ms | llama p50 TTFT ms | edge CPU ms/token | llama CPU ms/token |"),
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c, by in results.items():
        e, l = by["edge-node"], by["llama_cpp.server"]
        lines.append(f"| {c} | {e.tok_s:.1f} | {l.tok_s:.1f} | **{e.tok_s / l.tok_s:.2f}x** | {e.tbt_p50_ms:.1f} | "
                     f"{l.tbt_p50_ms:.1f} | {e.ttft_p50_ms:.0f} | {l.ttft_p50_ms:.0f} | {e.cpu_ms_per_token:.2f} | "
                     f"{l.cpu_ms_per_token:.2f} |")
    lines.append("")
    lines.append("Peak RSS: " + ", ".join(f"{k} {v:.0f} MiB" for k, v in rss.items()) + ".")
    return "\n".join(lines)


def write_docs(body: str) -> None:
    write_section(SECTION, body, DOCS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quant", default="q4_0", choices=["q4_0", "q4_k_m"])
    ap.add_argument("--tokens", type=int, default=128, help="output tokens per request")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-docs", action="store_true", help="do not touch docs/benchmarks.md")
    args = ap.parse_args()
    try:
        import llama_cpp.server
    except ImportError as e:
        raise SystemExit(f"llama-cpp-python's server extras are missing ({e}): pip install -e '.[edge,bench]'") from None

    t_start = time.monotonic()
    load_before = os.getloadavg()
    pressure: list[float] = []
    model = build_model(args.quant)
    print("measuring bare llama_decode CPU cost per token at batch 1/4/8/16", file=sys.stderr)
    kernel = kernel_ceiling(model)
    RESULTS.mkdir(parents=True, exist_ok=True)
    logs = RESULTS / "edge-logs"
    logs.mkdir(exist_ok=True)
    py = sys.executable
    ep, lp = free_port(), free_port()
    edge = ServerProc("edge-node", [py, "-m", "edge_node", "serve", "--model", str(model), "--port", str(ep),
                                    "--parallel", "16", "--ctx", "1024", "--threads", "1", "--model-name", "bench"],
                      ep, logs / "edge-node.log")
    llama = ServerProc("llama_cpp.server", [py, "-m", "llama_cpp.server", "--model", str(model), "--port", str(lp),
                                            "--n_threads", "1", "--n_threads_batch", "1", "--n_ctx", "2048",
                                            "--interrupt_requests", "false", "--model_alias", "bench"],
                       lp, logs / "llama_cpp_server.log")
    servers = [edge, llama]
    try:
        edge.start("/health")
        llama.start("/v1/models")
        for s in servers:
            asyncio.run(warm_up(s.url))
        rounds: dict[int, dict[str, list[Round]]] = {c: {s.name: [] for s in servers} for c in CONCURRENCY}
        for rep in range(args.repeats):
            for c in CONCURRENCY:
                order = servers if (rep + c) % 2 == 0 else servers[::-1]  # alternate who goes first
                for s in order:
                    r = asyncio.run(run_round(s, c, args.tokens, offset=rep * 100 + c))
                    if (p := cpu_pressure()) is not None:
                        pressure.append(p)
                    rounds[c][s.name].append(r)
                    print(f"  repeat {rep + 1}/{args.repeats} streams={c:2d} {s.name:17s} {r.tok_s:7.1f} tok/s "
                          f"tbt p50 {r.tbt_p50_ms:6.1f} ms cpu {r.cpu_ms_per_token:5.2f} ms/token "
                          f"({r.tokens} tokens in {r.wall_s:.1f} s)", file=sys.stderr)
        rss = {s.name: s.peak_rss_mib() for s in servers}
    finally:
        for s in servers:
            s.stop()

    results = {c: {n: median_round(rs) for n, rs in by.items()} for c, by in rounds.items()}
    table = render(results, rss)
    wall = time.monotonic() - t_start
    cpu = platform.processor() or next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text()
                                        .splitlines() if ln.startswith("model name")), "?")
    import llama_cpp

    kernel_line = " | ".join(f"batch {bs}: {ms:.2f}" for bs, ms in kernel.items())
    l_cpu = statistics.median(results[c]["llama_cpp.server"].cpu_ms_per_token for c in CONCURRENCY)
    ceiling = {bs: l_cpu / ms for bs, ms in kernel.items()}
    r8 = results[8]["edge-node"].tok_s / results[8]["llama_cpp.server"].tok_s
    r1 = results[1]["edge-node"].tok_s / results[1]["llama_cpp.server"].tok_s
    verdict = (f"Targets: 8 streams ≥ 3x → {r8:.2f}x ({'met' if r8 >= 3 else 'NOT met'}); "
               f"1 stream ≥ 0.95x → {r1:.2f}x ({'met' if r1 >= 0.95 else 'NOT met'}).")
    body = f"""Command: `.venv/bin/python -m bench.edge --quant {args.quant} --tokens {args.tokens} --repeats {args.repeats}`
(needs `pip install -e '.[edge,bench]'`; about {wall / 60:.0f} min here, including building the model once).

Model: generated llama, 12 layers, hidden 768, 12 heads, FFN 2048, 16384-token byte-level BPE vocabulary,
{args.quant.upper()} through llama.cpp's quantizer ({model.stat().st_size / 2**20:.0f} MiB). Both servers load
the same file with one llama.cpp thread (`--threads 1` / `--n_threads 1 --n_threads_batch 1`);
llama_cpp.server with `--interrupt_requests false` (otherwise a new request cuts the running one short).
edge-node: `--parallel 16 --ctx 1024`. Workload: streaming chat completions, {args.tokens} output tokens each,
temperature 0.7, top_k 40, min_p 0.05, no repetition penalty (sent explicitly to both), distinct prompts and
seeds; aggregate tok/s = all tokens / wall time of the round; TBT = time between tokens within one stream;
median of {args.repeats} alternating repeats.
Machine: {cpu}, {os.cpu_count()} cores shared with other work (load average {load_before[0]:.1f} at start;
CPU pressure (PSI some avg10) during the rounds: median {statistics.median(pressure) if pressure else float("nan"):.0f}%,
max {max(pressure) if pressure else float("nan"):.0f}% — the share of time runnable tasks waited for a core),
llama-cpp-python {llama_cpp.__version__} (CPU, AVX2 build), Python {platform.python_version()}.

{table}

{verdict}

Tokens per CPU-second (contention-independent efficiency), edge-node / llama_cpp.server:
{" | ".join(f"at {c}: {results[c]['llama_cpp.server'].cpu_ms_per_token / results[c]['edge-node'].cpu_ms_per_token:.2f}x" for c in CONCURRENCY)}.

Ceiling on this CPU: bare `llama_decode` (one thread, no sampling, no server) costs, in CPU ms per token,
{kernel_line}. llama_cpp.server spends {l_cpu:.2f} CPU ms per token (decode plus its Python per-token work),
so even a server with zero overhead could be at most {ceiling[8]:.2f}x faster at 8 streams
({ceiling[16]:.2f}x at 16) with the CPU to itself: a single core decoding Q4 weights with AVX2 kernels is
compute-bound already at batch 1, so batching mostly removes per-token overhead instead of saving weight reads
(on GPUs, where decode is memory-bound, batching multiplies throughput). The batched kernels are already the fast
ones: llama.cpp's load log shows every layer weight repacked to q4_0_8x8 (its AVX2 GEMM path).

llama_cpp.server decodes one request at a time: its aggregate rate stays at its single-stream rate and its
time to first token grows with the queue; edge-node decodes all streams in one `llama_decode` per step
(its p50 time between tokens is one batched step, shared by all streams). edge-node's larger RSS is its KV
cache, allocated up front: 16 slots × 1024 tokens × 36 KiB (F16 K and V, 12 layers × 768) = 576 MiB.
"""
    print("\n" + table + "\n\n" + verdict)
    out = {"command": " ".join(sys.argv), "quant": args.quant, "tokens": args.tokens, "repeats": args.repeats,
           "results": {c: {n: asdict(r) for n, r in by.items()} for c, by in results.items()},
           "rounds": {c: {n: [asdict(r) for r in rs] for n, rs in by.items()} for c, by in rounds.items()},
           "peak_rss_mib": rss, "load_average_at_start": load_before, "cpu_pressure_avg10": pressure,
           "kernel_cpu_ms_per_token": kernel,
           "wall_s": wall}
    (RESULTS / "edge.json").write_text(json.dumps(out, indent=2))
    if not args.no_docs:
        write_docs(body)
        print(f"wrote {DOCS.relative_to(REPO)} ({SECTION})", file=sys.stderr)


if __name__ == "__main__":
    main()
