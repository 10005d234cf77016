"""Stands in for llama-server's `tools/server/tests/utils.py`: the same module, with its server swapped.

Copied into the staged suite as `utils.py` (tests/llama_server/adaptations.py), so their tests' `from utils import *`
gets llama.cpp's own `utils.py` unchanged but for `ServerProcess`'s `start`, `stop` and `make_url`: `start` runs
`edge-node serve` on the real SmolLM2 (TIERGATE_LLAMA_TARGET=edge), or that node behind a real gateway (`gateway`),
instead of building and running `llama-server`. Every change is listed in ADAPTATIONS.md.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from tests.gateway.conftest import write_policy
from tests.support.edge import start_edge_node
from tests.support.servers import gateway_server
from tiergate.edge_node.model.packaged import packaged_path
from tiergate.gateway.auth import KeyRing
from tiergate.gateway.settings import Settings

_spec = importlib.util.spec_from_file_location("llama_utils", os.environ["TIERGATE_LLAMA_UTILS"])
assert _spec is not None and _spec.loader is not None
llama_utils = importlib.util.module_from_spec(_spec)
sys.modules["llama_utils"] = llama_utils
_spec.loader.exec_module(llama_utils)
from llama_utils import *  # noqa: E402, F403  (their tests import everything from `utils`)

TARGET = os.environ.get("TIERGATE_LLAMA_TARGET", "edge")
GATEWAY_KEY = "dummy"  # what their openai clients send; the gateway knows it as tenant `llama`
MODEL = "smollm2-135m-instruct"
# llama-server also serves the OpenAI routes without `/v1`; tiergate, like OpenAI and vLLM, only under it.
_UNPREFIXED = ("/chat/completions", "/completions", "/embeddings", "/models", "/responses", "/messages")

_servers: dict[tuple[Any, ...], tuple[str, int]] = {}  # one node (and gateway) per configuration, reused
_running = ExitStack()
atexit.register(_running.close)  # only if the session did not (conftest.py stops them at its end)


def stop_all() -> None:
    """Stop every node and gateway started, newest first."""
    _running.close()
    _servers.clear()


def _start(self: Any, timeout_seconds: int = 60) -> None:
    n_slots = self.n_slots or 1
    ctx = (self.n_ctx or 4096) // n_slots  # llama-server's --ctx-size is shared by its slots; the node's is per slot
    key = (TARGET, ctx, n_slots, self.model_alias, self.api_key)
    if key not in _servers:
        work = Path(os.environ.get("TIERGATE_LLAMA_WORKDIR", "tmp")) / f"server-{len(_servers)}"
        work.mkdir(parents=True, exist_ok=True)
        args = ["--parallel", str(n_slots), "--ctx", str(max(ctx, 256)), "--model-name", self.model_alias or MODEL]
        if self.api_key:
            args += ["--api-key", self.api_key]
        node = _running.enter_context(start_edge_node(packaged_path(MODEL), *args, workdir=work))
        if TARGET == "edge":
            _servers[key] = ("127.0.0.1", node.port)
        else:
            # Generous waits: llama-server has none, and a shared CI machine can be slow (a 1-slot node queues).
            policy = write_policy(work / "policy.yaml", [node.url], ["http://127.0.0.1:9"], fallback=False,
                                  cache=False, queue_s=300, first_byte_s=300, between_chunks_s=300, total_s=600)
            policy.write_text(policy.read_text() + 'model_aliases:\n  "*": auto\n')
            gw = _running.enter_context(gateway_server(
                Settings(policy=policy, embedder=None, redis_url=None),
                keyring=KeyRing.from_inline(f"{self.api_key or GATEWAY_KEY}=llama:normal")))
            _servers[key] = ("127.0.0.1", gw.port)
    self.server_host, self.server_port = _servers[key]
    self.ready = True
    llama_utils.server_instances.add(self)


def _stop(self: Any) -> None:
    """The node stays up for the next test with the same configuration; all stop when the run ends."""
    llama_utils.server_instances.discard(self)


def _make_url(self: Any, path: str, host: str | None = None) -> str:
    if path.split("?")[0] in _UNPREFIXED or path.startswith(tuple(p + "/" for p in _UNPREFIXED)):
        path = "/v1" + path
    return f"http://{host or self.server_host}:{self.server_port}{path}"


_make_request = llama_utils.ServerProcess.make_request
_make_stream_request = llama_utils.ServerProcess.make_stream_request


def _with_key(headers: dict[str, Any] | None) -> dict[str, Any] | None:
    """Behind the gateway a request without a key gets the test tenant's (the node itself needs none)."""
    if TARGET != "gateway":
        return headers
    headers = dict(headers or {})
    if not any(k.lower() in ("authorization", "x-api-key") for k in headers):
        headers["Authorization"] = f"Bearer {GATEWAY_KEY}"
    return headers


def _request(self: Any, method: str, path: str, data: Any = None, headers: dict[str, Any] | None = None,
             *args: Any, **kwargs: Any) -> Any:
    return _make_request(self, method, path, data, _with_key(headers), *args, **kwargs)


def _stream_request(self: Any, method: str, path: str, data: Any = None, headers: dict[str, Any] | None = None,
                    *args: Any, **kwargs: Any) -> Any:
    return _make_stream_request(self, method, path, data, _with_key(headers), *args, **kwargs)


llama_utils.ServerProcess.start = _start
llama_utils.ServerProcess.stop = _stop
llama_utils.ServerProcess.make_url = _make_url
llama_utils.ServerProcess.make_request = _request
llama_utils.ServerProcess.make_stream_request = _stream_request
