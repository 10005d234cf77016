"""What bench/edge runs: the models (two real ones from PyPI packages and the generated demo model) and the three
servers, each started on the same GGUF file with the same llama.cpp settings.

- `edge-node serve`: ours, continuous batching in Python over llama.cpp's low-level API.
- `llama-server`: llama.cpp's own C++ server, built by bench/anchors.py from the llama.cpp that llama-cpp-python
  vendors (the same library the edge node runs), `--parallel N` continuous batching.
- `python -m llama_cpp.server`: llama-cpp-python's server, one request at a time; `--interrupt_requests false`,
  since its default cuts a running stream short when the next request arrives. It runs from its own virtualenv
  (bench/anchors.py: its FastAPI extras are not the product's) with the same llama-cpp-python wheel.

Same for all three: one llama.cpp thread for generation and for batches (the machine's 2 cores are shared, and
more threads than free cores collapses llama.cpp's speed), 512-token batches, the same context per slot, the
model's own chat template (Gemma's base model has none: llama.cpp's built-in `gemma` template, which the edge
node picks by itself, is named to the other two). llama-server keeps its other defaults (flash attention auto,
separate KV per slot at an explicit `-np`, its RAM prompt cache), as an operator would run it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from bench.procs import Server, free_port
from tiergate.core.paths import tiergate_home
from tiergate.edge_node.model.demo_model import build_demo_model

__all__ = ["MODELS", "ModelSpec", "banned_tokens", "base_url", "make_servers", "prompt_tokens", "resolve_model"]


@dataclass(frozen=True)
class ModelSpec:
    key: str
    title: str
    template: str | None  # the chat template to name to the other servers when the GGUF has none


MODELS = {
    "smollm2": ModelSpec("smollm2", "SmolLM2-135M-Instruct Q4_1", None),
    "gemma": ModelSpec("gemma", "Gemma 3 270M Q4_K_M (base model)", "gemma"),
    "demo": ModelSpec("demo", "generated demo model (edge-node demo-model: 2 layers, 256 wide, Q4_0)", None),
    "demo-bench": ModelSpec("demo-bench", "generated model (--size bench: 12 layers, 768 wide, Q4_0)", None),
}


def resolve_model(key: str) -> Path:
    """The GGUF file for a model key: packaged models are verified by sha256, generated ones built once."""
    if key in ("smollm2", "gemma"):
        from tiergate.edge_node.model.packaged import (
            packaged_path,  # verifies the file (size, sha256) before it is used
        )

        return packaged_path({"smollm2": "smollm2-135m-instruct", "gemma": "gemma-3-270m"}[key])
    size = "tiny" if key == "demo" else "bench"
    out = tiergate_home() / "bench" / f"edge-{size}"
    path = out / f"tiergate-demo-{size}-q4_0.gguf"
    if not path.exists():
        print(f"building the {size} demo model in {out}", file=sys.stderr)
        build_demo_model(out, size=size, quant="q4_0", seed=0)
    return path


_EOG = """
import json, sys, llama_cpp as ll
cb = ll.llama_log_callback(lambda *a: None)  # kept referenced: llama.cpp holds the pointer
ll.llama_log_set(cb, None)
ll.llama_backend_init()
p = ll.llama_model_default_params(); p.vocab_only = True
m = ll.llama_model_load_from_file(sys.argv[1].encode(), p)
v = ll.llama_model_get_vocab(m)
print(json.dumps([t for t in range(ll.llama_vocab_n_tokens(v)) if ll.llama_vocab_is_eog(v, t)]))
"""


def banned_tokens(model: Path) -> list[int]:
    """The model's end-of-generation tokens as llama.cpp sees them (read in a child: this process stays small)."""
    out = subprocess.run([sys.executable, "-c", _EOG, str(model)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def make_servers(model: Path, spec: ModelSpec, llama_server: Path, lcp_bin: Path, slots: int, ctx: int, logs: Path,
                 ) -> list[Server]:
    """The three servers for one model, not yet started (names: edge-node, llama-server, llama_cpp.server)."""
    py = sys.executable
    ep, lp, pp = free_port(), free_port(), free_port()
    stem = spec.key
    edge = Server("edge-node", [py, "-m", "tiergate.edge_node", "serve", "--model", str(model), "--port", str(ep),
                                "--parallel", str(slots), "--ctx", str(ctx), "--threads", "1", "--batch", "512",
                                "--model-name", "bench"],
                  f"http://127.0.0.1:{ep}/health", log=logs / f"{stem}-edge-node.log")
    ls_args = [str(llama_server), "-m", str(model), "--host", "127.0.0.1", "--port", str(lp), "-np", str(slots),
               "-c", str(slots * ctx), "-t", "1", "-tb", "1", "-b", "512", "-ub", "512", "--alias", "bench"]
    lcp_args = [str(lcp_bin / "python"), "-m", "llama_cpp.server", "--model", str(model), "--port", str(pp), "--n_threads", "1",
                "--n_threads_batch", "1", "--n_ctx", str(ctx), "--n_batch", "512", "--interrupt_requests", "false",
                "--model_alias", "bench"]
    if spec.template:
        # A built-in template's name is only read as a name with Jinja off: with Jinja on (the default), llama-server
        # takes "gemma" as the template text itself and every prompt becomes the 3 tokens of that word.
        ls_args += ["--no-jinja", "--chat-template", spec.template]
        lcp_args += ["--chat_format", spec.template]
    return [edge,
            Server("llama-server", ls_args, f"http://127.0.0.1:{lp}/health", log=logs / f"{stem}-llama-server.log"),
            Server("llama_cpp.server", lcp_args, f"http://127.0.0.1:{pp}/v1/models",
                   env={"HF_HUB_OFFLINE": "1"}, log=logs / f"{stem}-llama_cpp_server.log")]


def base_url(server: Server) -> str:
    u = urlsplit(server.health_url)
    return f"{u.scheme}://{u.netloc}"


def prompt_tokens(server: Server, text: str) -> int | None:
    """How many prompt tokens the server makes of one chat message (its usage; None when it reports none): every
    server must see the same prompt, or the comparison is not of the same work."""
    r = httpx.post(base_url(server) + "/v1/chat/completions", timeout=120, json={
        "model": "bench", "max_tokens": 1, "temperature": 0, "messages": [{"role": "user", "content": text}]})
    r.raise_for_status()
    return (r.json().get("usage") or {}).get("prompt_tokens")
