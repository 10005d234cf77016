"""Real edge nodes for tests: a tiny INT4 demo model built once per session, and `edge-node serve` processes.

`edge_model` builds the tiny llama GGUF (Q4_0, llama.cpp's quantizer) with its tokenizer.json in a
session tmp dir. `edge_node_factory(...)` starts `python -m tiergate.edge_node serve` as a real subprocess on a
free 127.0.0.1 port, waits for /health, and stops every node it started at the end of the test
(SIGTERM, then SIGKILL). `start_edge_node()` is the same as a context manager, for other fixtures
(e.g. a gateway test that needs two nodes). Without llama-cpp-python these fixtures skip, and fail under CI
or TIERGATE_REQUIRE_LLAMA=1 (tests/support/require.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.ports import free_port
from tests.support.require import skip_or_fail
from tests.support.waiting import wait_until
from tiergate.edge_node.model.demo_model import build_demo_model
from tiergate.edge_node.model.packaged import packaged_path

__all__ = [
    "EdgeProcess",
    "edge_model",
    "edge_node",
    "edge_node_factory",
    "parse_metrics",
    "registered_node",
    "run_cli",
    "start_edge_node",
]

START_TIMEOUT_S = 120.0


def parse_metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Prometheus text → {(sample name, sorted labels): value}."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@dataclass
class EdgeProcess:
    """One running `edge-node serve` process."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    args: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=5).json()

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return parse_metrics(httpx.get(self.url + "/metrics", timeout=5).text)

    def metric(self, name: str, **labels: str) -> float:
        return self.metrics().get((name, tuple(sorted(labels.items()))), 0.0)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        """Signal the node and wait; SIGKILL if it does not exit in time. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def _require_llama() -> None:
    try:
        import llama_cpp  # noqa: F401  # optional dependency: the edge extra
    except ImportError:
        skip_or_fail("llama-cpp-python is not installed (pip install -e '.[edge]')", "llama")


@contextmanager
def start_edge_node(
    model: Path,
    *extra_args: str,
    workdir: Path,
    port: int | None = None,
    env: dict[str, str] | None = None,
    wait: bool = True,
) -> Iterator[EdgeProcess]:
    """Run `edge-node serve --model MODEL` on 127.0.0.1 until the block ends."""
    port = port or free_port()
    args = [sys.executable, "-m", "tiergate.edge_node", "serve", "--model", str(model), "--host", "127.0.0.1",
            "--port", str(port), "--threads", "1", "--log-format", "json", *extra_args]
    log_path = workdir / f"edge-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})
    node = EdgeProcess(proc, port, log_path, args)
    try:
        if wait:
            _wait_healthy(node)
        yield node
    finally:
        node.stop(signal.SIGTERM, timeout_s=20)


@contextmanager
def smollm2_node(workdir: Path) -> Iterator[EdgeProcess]:
    """A real edge node on the packaged SmolLM2 (installed by scripts/setup.sh --dev; missing is a failure), two
    slots of 2,048 tokens, serving the name `smollm2`: what the API and client conformance tests drive."""
    with start_edge_node(packaged_path("smollm2-135m-instruct"), "--parallel", "2", "--ctx", "2048",
                         "--model-name", "smollm2", workdir=workdir) as node:
        yield node


def _wait_healthy(node: EdgeProcess) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if node.proc.poll() is not None:
            raise RuntimeError(f"edge-node exited with {node.proc.returncode} during start-up:\n{node.log()[-2000:]}")
        try:
            if httpx.get(node.url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    node.stop(signal.SIGKILL)
    raise RuntimeError(f"edge-node did not become healthy within {START_TIMEOUT_S}s:\n{node.log()[-2000:]}")


@pytest.fixture(scope="session")
def edge_model(tmp_path_factory: pytest.TempPathFactory):
    """The tiny demo model (Q4_0 GGUF + tokenizer.json), built once per session."""
    _require_llama()
    return build_demo_model(tmp_path_factory.mktemp("edge-model"), size="tiny", quant="q4_0", seed=0)


@pytest.fixture
def edge_node_factory(edge_model, tmp_path: Path) -> Iterator[Callable[..., EdgeProcess]]:
    """Start edge nodes: factory(*extra_args, model=None, port=None, env=None, wait=True) -> EdgeProcess."""
    with ExitStack() as stack:

        def factory(*extra_args: str, model: Path | None = None, port: int | None = None,
                    env: dict[str, str] | None = None, wait: bool = True) -> EdgeProcess:
            return stack.enter_context(start_edge_node(model or edge_model.gguf, *extra_args, workdir=tmp_path,
                                                       port=port, env=env, wait=wait))

        yield factory


@pytest.fixture
def edge_node(edge_node_factory) -> EdgeProcess:
    """One edge node with 4 slots and a 1024-token context per slot."""
    return edge_node_factory("--parallel", "4", "--ctx", "1024")


def run_cli(*args: str, timeout_s: float = 120.0, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `python -m tiergate.edge_node ARGS` to completion (for exit-code and error-message tests)."""
    return subprocess.run([sys.executable, "-m", "tiergate.edge_node", *args], capture_output=True, text=True, check=False,
                          timeout=timeout_s, env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})


def registered_node(factory: Callable[..., EdgeProcess], gw, *extra: str, timeout_s: float = 30) -> EdgeProcess:
    """An edge node (4 slots, 1024 tokens each) that registers with the gateway under test `gw`, returned once the
    gateway's edge pool lists it."""
    node = factory("--parallel", "4", "--ctx", "1024", "--gateway", gw.url, *extra)
    pool = gw.gateway.tiers["edge"].pool
    wait_until(lambda: any(e.base_url == node.url for e in pool.endpoints()), timeout_s=timeout_s,
               what="edge node registration")
    return node
