"""README command 1: `tiergate demo` serves the whole product, and stopping it stops everything it started.

The demo listens on fixed ports; when another process holds one, the test skips on a developer's machine and
fails under CI (tests/support/require.py). A long prompt goes through the demo's `long-prompt` rule to its cloud
stand-in, which must serve the context its policy promises (the issue-25 bug: a 1,700-word prompt got 400
context_length_exceeded from a stand-in running 2,048 tokens per slot under a policy promising 8,192).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.support.require import skip_or_fail
from tiergate.gateway.auth import DEMO_KEY
from tiergate.gateway.demo import contexts

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
PORTS = (8080, 8081, 8090)  # gateway, edge node, cloud stand-in: fixed by the demo and the default policy


def _busy(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


WORDS = ["the", "river", "carried", "stone", "and", "cloud", "past", "the", "lantern", "of", "the", "harbor", "while", "a", "meadow", "signal", "rang", "copper", "over", "the", "garden", "in", "winter", "and", "an", "orbit", "of", "canyon", "violet", "engines", "crossed", "the", "forest", "ladder"]


def _long_prompt(n_words: int) -> str:
    return "Summarise this text. " + " ".join(WORDS[i % len(WORDS)] for i in range(n_words))


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_demo_serves_and_stops_everything_it_started(tmp_path: Path, stop_signal: int) -> None:
    if busy := [p for p in PORTS if _busy(p)]:
        skip_or_fail(f"the demo's ports {busy} are in use by another process", "demo")
    log = (tmp_path / "demo.log").open("wb")
    demo = subprocess.Popen([str(Path(sys.executable).parent / "tiergate"), "demo"], stdout=log,
                            stderr=subprocess.STDOUT, env=os.environ | {"NO_COLOR": "1"}, start_new_session=True)
    children: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 300
        while b"tiergate demo is up" not in (tmp_path / "demo.log").read_bytes():
            assert demo.poll() is None, (tmp_path / "demo.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the demo did not come up in 300 s"
            time.sleep(0.5)
        children = psutil.Process(demo.pid).children(recursive=True)
        assert len(children) >= 3  # cloud stand-in, gateway, edge node
        r = httpx.post("http://127.0.0.1:8080/v1/chat/completions", timeout=60,
                       headers={"Authorization": f"Bearer {DEMO_KEY}"},
                       json={"model": "auto", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 8,
                             "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.headers["x-tiergate-tier"] == "edge" and r.json()["choices"][0]["message"]["content"]
        models = httpx.get("http://127.0.0.1:8080/v1/models", headers={"Authorization": f"Bearer {DEMO_KEY}"}).json()
        assert "LOCAL STAND-IN" in str(models)

        # The demo's policy and its servers agree: the stand-in serves what the cloud tier promises, and a
        # 1,700-word prompt goes through the long-prompt rule to it and is answered.
        promised = contexts()["cloud"]
        served = httpx.get("http://127.0.0.1:8090/v1/models", timeout=10).json()["data"][0]["max_model_len"]
        assert served >= promised, (served, promised)
        r = httpx.post("http://127.0.0.1:8080/v1/chat/completions", timeout=120,
                       headers={"Authorization": f"Bearer {DEMO_KEY}"},
                       json={"model": "auto", "messages": [{"role": "user", "content": _long_prompt(1700)}],
                             "max_tokens": 16, "temperature": 0})
        assert r.status_code == 200, r.text[:500]
        assert r.headers["x-tiergate-rule"] == "long-prompt" and r.headers["x-tiergate-tier"] == "cloud"
        assert 1500 <= r.json()["usage"]["prompt_tokens"] <= promised

        logged_before_stop = len((tmp_path / "demo.log").read_text(errors="replace"))
        if stop_signal == signal.SIGINT:  # Ctrl-C: the terminal signals the whole foreground process group
            os.killpg(demo.pid, signal.SIGINT)
        else:  # docker stop, systemd: the demo's own process
            demo.send_signal(stop_signal)
        assert demo.wait(timeout=60) == 0
        _, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, f"left running after the demo stopped: {[p.cmdline() for p in alive]}"
        assert not any(_busy(p) for p in PORTS)
        output = (tmp_path / "demo.log").read_text(errors="replace")
        assert "Traceback" not in output, output[-3000:]  # every process stopped cleanly on the signal
        stopping = output[logged_before_stop:]
        assert "unreachable" not in stopping, stopping[-3000:]  # stopped in order: nothing polled a stopped server
    finally:
        if demo.poll() is None:
            demo.kill()
        for p in children:
            with contextlib.suppress(psutil.Error):
                p.kill()
        log.close()
