"""The gateway's own cost without the network server: requests driven through the ASGI app in one process.

    .venv/bin/python -m bench.overhead.inprocess [--batches 12] [--gap-ms 0] [--tree PATH] [--policy-extra FILE]

An instant upstream runs on CPU 1; this process (the gateway app and its aiohttp client) on CPU 0. Back to
back (`--gap-ms 0`) it reports the best batch of 300 requests: wall and CPU ms per request, steady enough on a
noisy machine to compare two builds (`--tree` puts another checkout first on the import path). With a gap
between requests it reports the p50/p90 wall time of requests that find the core idle, i.e. cold.
`--policy-extra` appends a file's YAML sections (`costs`, `budgets`, ...) to the bench policy: the cost of a
feature, measured by running with and without it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import uvloop


async def _drive(app, key: str, batches: int, gap_s: float) -> str:
    """Start the app's lifespan, measure, shut it down (as uvicorn would)."""
    to_app: asyncio.Queue = asyncio.Queue()
    from_app: asyncio.Queue = asyncio.Queue()
    lifespan = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, to_app.get,
                                       from_app.put))
    await to_app.put({"type": "lifespan.startup"})
    await from_app.get()
    try:
        return await _measure(app, key, batches, gap_s)
    finally:
        await to_app.put({"type": "lifespan.shutdown"})
        await from_app.get()
        await lifespan


async def _measure(app, key: str, batches: int, gap_s: float) -> str:
    headers = [(b"authorization", f"Bearer {key}".encode()), (b"content-type", b"application/json")]

    async def one(i: int) -> None:
        body = (b'{"model":"auto","messages":[{"role":"user","content":"bench prompt %d: how do edge and cloud '
                b'tiers share traffic?"}],"max_tokens":8,"temperature":0}' % i)
        messages = [{"type": "http.request", "body": body, "more_body": False}]
        status: list[int] = []
        own: list[float] = []

        async def receive():
            if messages:
                return messages.pop()
            await asyncio.Event().wait()
            return None

        async def send(message):
            if message["type"] == "http.response.start":
                status.append(message["status"])
                own.extend(float(v) for k, v in message["headers"] if k == b"x-tiergate-overhead-ms")

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
                 "query_string": b"", "root_path": "", "headers": headers, "client": ("127.0.0.1", 1),
                 "server": ("127.0.0.1", 2), "state": {}}
        await app(scope, receive, send)
        if status != [200]:
            raise RuntimeError(f"the gateway answered {status}")
        owns.extend(own)

    owns: list[float] = []
    n = 0
    for _ in range(200):  # warm-up
        await one(n)
        n += 1
    if gap_s:
        walls = []
        owns.clear()
        for _ in range(batches * 100):
            await asyncio.sleep(gap_s)
            t0 = time.perf_counter()
            await one(n)
            n += 1
            walls.append(time.perf_counter() - t0)
        walls.sort()
        return (f"gap {gap_s * 1000:g} ms: wall p50 {statistics.median(walls) * 1000:.3f} ms, "
                f"p90 {walls[int(len(walls) * 0.9)] * 1000:.3f} ms; gateway's own time (x-tiergate-overhead-ms) "
                f"p50 {statistics.median(owns):.3f} ms")
    best_wall = best_cpu = float("inf")
    for _ in range(batches):
        w0, c0 = time.perf_counter(), time.process_time()
        for _ in range(300):
            await one(n)
            n += 1
        best_wall = min(best_wall, (time.perf_counter() - w0) / 300 * 1000)
        own_p50 = statistics.median(owns[-300:])
        best_cpu = min(best_cpu, (time.process_time() - c0) / 300 * 1000)
    return (f"back to back: best wall {best_wall:.3f} ms/request, best CPU {best_cpu:.3f} ms/request; "
            f"gateway's own time (x-tiergate-overhead-ms) p50 of the last batch {own_p50:.3f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=12)
    ap.add_argument("--gap-ms", type=float, default=0.0)
    ap.add_argument("--tree", type=Path, help="import gateway/, cache/, policies/ from this checkout")
    ap.add_argument("--policy-extra", type=Path, help="YAML sections appended to the bench policy")
    args = ap.parse_args()
    if args.tree:
        sys.path.insert(0, str(args.tree.resolve()))
    # after --tree is on sys.path: the bench's own modules and the gateway come from the tree measured
    from bench.overhead.targets import KEY, POLICY
    from bench.procs import Server, free_port

    tmp = Path(tempfile.mkdtemp(prefix="tg-inprocess-"))
    port = free_port()
    upstream = Server("upstream", [sys.executable, "-m", "tests.support.instant_upstream", "--port", str(port)],
                      f"http://127.0.0.1:{port}/health", cpus={1}, log=tmp / "upstream.log").start()
    try:
        extra = args.policy_extra.read_text() if args.policy_extra else ""
        (tmp / "policy.yaml").write_text(POLICY.format(port=port, defaults="", rules="") + extra)
        os.environ.update({"TIERGATE_POLICY": str(tmp / "policy.yaml"), "TIERGATE_API_KEYS": f"{KEY}=bench",
                           "TIERGATE_LOG_LEVEL": "warning", "TIERGATE_EMBEDDER": ""})
        os.sched_setaffinity(0, {0})
        from tiergate.gateway.app import create_app  # after --tree (above) and after the environment it reads

        print(f"{args.tree or 'this checkout'}: "
              f"{uvloop.run(_drive(create_app(), KEY, args.batches, args.gap_ms / 1000))}")
    finally:
        upstream.stop()


if __name__ == "__main__":
    main()
