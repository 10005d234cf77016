"""SIGTERM on a real `tiergate serve` process: readiness goes false, the stream in flight finishes, exit 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx

from bench.instant_upstream import make_app
from tests.gateway.conftest import write_policy
from tests.support.servers import aiohttp_server, free_port, wait_until


def test_sigterm_drains_then_exits(tmp_path: Path):
    with aiohttp_server(make_app(60, "slow", model="edge-model")) as edge, \
            aiohttp_server(make_app(4, "ok", model="cloud-model")) as cloud:
        pol = write_policy(tmp_path / "policy.yaml", [edge.url], [cloud.url], fallback=False)
        port = free_port()
        env = os.environ | {"TIERGATE_POLICY": str(pol), "TIERGATE_PORT": str(port), "TIERGATE_API_KEYS": "dk-12345=d",
                            "TIERGATE_DRAIN_DELAY_S": "1.5", "TIERGATE_GRACEFUL_SHUTDOWN_S": "20",
                            "TIERGATE_EMBEDDER": "", "TIERGATE_LOG_FORMAT": "json"}
        log = (tmp_path / "gw.log").open("wb")
        proc = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve"], env=env, stdout=log,
                                stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_until(lambda: _status(base + "/readyz") == 200, timeout_s=30, what="gateway ready")
            events: list[str] = []
            first = threading.Event()

            def stream() -> None:
                with httpx.stream("POST", base + "/v1/chat/completions", timeout=30,
                                  headers={"Authorization": "Bearer dk-12345"},
                                  json={"model": "auto", "stream": True, "max_tokens": 60, "temperature": 1,
                                        "messages": [{"role": "user", "content": "long"}]}) as r:
                    for line in r.iter_lines():
                        if line.startswith("data: "):
                            events.append(line)
                            first.set()

            t = threading.Thread(target=stream)
            t.start()
            assert first.wait(10)
            proc.send_signal(signal.SIGTERM)
            wait_until(lambda: _status(base + "/readyz") == 503, timeout_s=1.4, what="readiness false while draining")
            t.join(30)
            assert events[-1] == "data: [DONE]"
            assert sum('"content"' in e for e in events) == 60  # the whole answer, not a truncated one
            assert proc.wait(30) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after a clean shutdown
        finally:
            if proc.poll() is None:
                proc.kill()
        assert b"draining" in (tmp_path / "gw.log").read_bytes()


def _status(url: str) -> int:
    try:
        return httpx.get(url, timeout=1).status_code
    except httpx.HTTPError:
        return 0
