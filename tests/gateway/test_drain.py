"""SIGTERM or SIGINT on a real `tiergate serve` process: readiness goes false while the listener stays open, the
stream in flight finishes, what outlives the graceful time ends with an explicit error, no traceback is printed,
the process exits. The tests wait on states, not on times: a drain delay long enough never to run out by itself
(a second signal ends it), and a graceful time that the backends' answers are sure to outlast."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from tests.gateway.conftest import write_policy
from tests.support.instant_upstream import HITS, make_app
from tests.support.servers import aiohttp_server, free_port
from tests.support.waiting import wait_until


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_a_signal_drains_then_exits(tmp_path: Path, sig: int):
    """The first signal turns readiness false and keeps serving; the stream in flight finishes whole; a second
    signal ends the delay, and the process exits cleanly."""
    with aiohttp_server(make_app(60, "slow", model="edge-model")) as edge, \
            aiohttp_server(make_app(4, "ok", model="cloud-model")) as cloud:
        pol = write_policy(tmp_path / "policy.yaml", [edge.url], [cloud.url], fallback=False)
        port = free_port()
        env = os.environ | {"TIERGATE_POLICY": str(pol), "TIERGATE_PORT": str(port), "TIERGATE_API_KEYS": "dk-12345=d",
                            "TIERGATE_DRAIN_DELAY_S": "600", "TIERGATE_GRACEFUL_SHUTDOWN_S": "20",
                            "TIERGATE_EMBEDDER": "", "TIERGATE_LOG_FORMAT": "json"}
        log = (tmp_path / "gw.log").open("wb")
        proc = subprocess.Popen([sys.executable, "-m", "tiergate.gateway.cli", "serve"], env=env, stdout=log,
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
            proc.send_signal(sig)
            wait_until(lambda: _status(base + "/readyz") == 503, timeout_s=30, what="readiness false while draining")
            t.join(30)
            assert events[-1] == "data: [DONE]"
            assert sum('"content"' in e for e in events) == 60  # the whole answer, not a truncated one
            assert _status(base + "/readyz") == 503  # still listening: the delay has not run out by itself
            proc.send_signal(sig)
            assert proc.wait(30) in (0, -sig, 128 + sig)  # uvicorn re-raises the signal after a clean shutdown
        finally:
            if proc.poll() is None:
                proc.kill()
        output = (tmp_path / "gw.log").read_bytes()
        assert b"draining" in output and b"Traceback" not in output, output[-3000:]


def test_what_outlives_the_graceful_time_ends_with_an_explicit_error(tmp_path: Path):
    """A stream of 10 s and a JSON answer of 10 s against a graceful time of 3 s: each gets an explicit error
    (an SSE error event then [DONE]; a 503 `shutting_down`), not a connection cut by uvicorn, and no traceback."""
    with aiohttp_server(make_app(200, "slow", model="edge-model")) as edge, \
            aiohttp_server(make_app(4, "ok", model="cloud-model")) as cloud:
        pol = write_policy(tmp_path / "policy.yaml", [edge.url], [cloud.url], fallback=False, first_byte_s=30,
                           total_s=60)
        port = free_port()
        env = os.environ | {"TIERGATE_POLICY": str(pol), "TIERGATE_PORT": str(port), "TIERGATE_API_KEYS": "dk-12345=d",
                            "TIERGATE_DRAIN_DELAY_S": "0.2", "TIERGATE_GRACEFUL_SHUTDOWN_S": "3",
                            "TIERGATE_LOG_FORMAT": "json"}
        log = (tmp_path / "gw.log").open("wb")
        proc = subprocess.Popen([sys.executable, "-m", "tiergate.gateway.cli", "serve"], env=env, stdout=log,
                                stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        ask = {"model": "auto", "max_tokens": 200, "temperature": 1, "messages": [{"role": "user", "content": "x"}]}
        try:
            wait_until(lambda: _status(base + "/readyz") == 200, timeout_s=30, what="gateway ready")
            events: list[str] = []
            got: dict[str, httpx.Response] = {}
            first = threading.Event()

            def stream() -> None:
                with httpx.stream("POST", base + "/v1/chat/completions", timeout=60,
                                  headers={"Authorization": "Bearer dk-12345"}, json=ask | {"stream": True}) as r:
                    for line in r.iter_lines():
                        if line.startswith("data: "):
                            events.append(line)
                            first.set()

            def whole() -> None:
                got["json"] = httpx.post(base + "/v1/chat/completions", timeout=60, json=ask,
                                         headers={"Authorization": "Bearer dk-12345"})

            threads = [threading.Thread(target=stream), threading.Thread(target=whole)]
            for t in threads:
                t.start()
            assert first.wait(10)
            wait_until(lambda: edge.app[HITS] == 2, timeout_s=10, what="both requests at the backend")
            proc.send_signal(signal.SIGTERM)
            for t in threads:
                t.join(60)
            assert proc.wait(30) in (0, -signal.SIGTERM)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert events[-1] == "data: [DONE]" and "shutting_down" in events[-2], events[-3:]
        assert 0 < sum('"content"' in e for e in events) < 200  # it had begun, and was cut short explicitly
        r = got["json"]
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down", r.text
        output = (tmp_path / "gw.log").read_bytes()
        assert b"Traceback" not in output and b"shutdown_ending_requests" in output, output[-3000:]


def _status(url: str) -> int:
    try:  # a generous timeout: a busy machine answers slowly, and a slow answer is still an answer
        return httpx.get(url, timeout=30).status_code
    except httpx.HTTPError:
        return 0
