"""`cloud-pool`: check, render and launch vLLM servers from a spec; build the tiny test model.

Tested in `tests/cloud_pool/test_render.py`.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer
from rich.console import Console

from tiergate.cloud_pool import render
from tiergate.cloud_pool.process import UnauthenticatedBind, VllmProcess, VllmStartError
from tiergate.cloud_pool.spec import SpecError, VllmSpec, load_spec
from tiergate.cloud_pool.vllm_env import REPO_ROOT, missing_reason, vllm_python

app = typer.Typer(help="vLLM server specs for tiergate's cloud tier: check, render, launch.", no_args_is_help=True)
_err = Console(stderr=True)

_STOP_GRACE_S = 20.0

SpecArg = Annotated[Path, typer.Argument(help="vLLM server spec (YAML)", exists=False, dir_okay=False)]


def _load(path: Path) -> VllmSpec:
    try:
        return load_spec(path)
    except SpecError as exc:
        for problem in exc.problems:
            _err.print(f"[red]error[/red] {problem}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None


@app.command()
def check(spec_file: SpecArg) -> None:
    """Validate a spec; print a one-line summary, or every problem with file:line:column and field."""
    spec = _load(spec_file)
    spec_method = spec.speculative.method
    typer.echo(
        f"ok: {spec.name}: {spec.model} as {spec.model_name!r} on {spec.device}, "
        f"tp={spec.tensor_parallel_size} pp={spec.pipeline_parallel_size} nodes={spec.nodes}, "
        f"speculative={spec_method}, prefix caching {'on' if spec.enable_prefix_caching else 'off'}"
    )


@app.command("render")
def render_cmd(
    spec_file: SpecArg,
    k8s: Annotated[Path | None, typer.Option("--k8s", help="write Kubernetes manifests here ('-' for stdout)")] = None,
) -> None:
    """Print the vLLM command line (with its environment); optionally write Kubernetes manifests."""
    spec = _load(spec_file)
    python = "python" if spec.device == "cpu" else None
    typer.echo(render.shell_command(spec, python=python))
    if k8s is not None:
        try:
            text = render.kubernetes_yaml(spec)
        except UnauthenticatedBind as exc:
            _err.print(f"[red]error[/red] {exc}")
            raise typer.Exit(2) from None
        if str(k8s) == "-":
            typer.echo(text, nl=False)
        else:
            k8s.write_text(text)
            _err.print(f"wrote {k8s} (gateway tier discovery: dns {render.service_dns(spec)} port {spec.port})")


@app.command()
def launch(
    spec_file: SpecArg,
    port: Annotated[int | None, typer.Option(help="override the spec's port")] = None,
    model: Annotated[str | None, typer.Option(help="override the spec's model (path or HF id)")] = None,
    log: Annotated[Path | None, typer.Option(help="server log file (default: a temp file)")] = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait for /health")] = 600.0,
) -> None:
    """Start the server locally, show progress until /health answers 200, then run until signalled.

    CPU specs use the vLLM virtualenv's python (TIERGATE_VLLM_PYTHON or <repo>/.venv-vllm);
    SIGTERM and Ctrl-C are forwarded so the server shuts down cleanly.
    """
    spec = _load(spec_file)
    python: str | None = None
    if spec.device == "cpu":
        found = vllm_python()
        if found is None:
            _err.print(f"[red]error[/red] {missing_reason()}")
            raise typer.Exit(2)
        python = str(found)
        model_path = Path(model or spec.model)
        if (model or spec.model).startswith((".", "/")) and not model_path.exists():
            _err.print(f"[red]error[/red] model directory {model_path} does not exist; "
                       f"build it with: cloud-pool tiny-model {model_path}")
            raise typer.Exit(2)
    workdir = Path(tempfile.mkdtemp(prefix=f"cloud-pool-{spec.name}-"))
    try:
        server = VllmProcess.from_spec(spec, workdir, python=python, model=model, port=port, log_path=log)
    except UnauthenticatedBind as exc:
        _err.print(f"[red]error[/red] {exc}")
        raise typer.Exit(2) from None
    _err.print(f"starting {spec.name} (pid {server.pid}), log {server.log_path}")
    stop_requested: list[float] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        # Only signal here; the main loop below notices the exit and cleans up.
        if not stop_requested:
            _err.print(f"received {signal.Signals(signum).name}: stopping vLLM")
            stop_requested.append(time.monotonic())
            if server.alive():
                server.proc.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        with _err.status("waiting for /health") as status:
            took = server.wait_healthy(
                timeout,
                on_progress=lambda elapsed, line: status.update(f"{elapsed:4.0f}s waiting for /health  {line[-90:]}"),
            )
    except VllmStartError as exc:
        server.terminate()
        if stop_requested:
            shutil.rmtree(workdir, ignore_errors=True)
            raise typer.Exit(0) from None
        _err.print(f"[red]error[/red] {exc}", highlight=False)  # the work dir (and log) stay for a look
        raise typer.Exit(1) from None
    _err.print(f"[green]ready[/green] {server.base_url} serving {spec.model_name!r} after {took:.0f}s")
    while server.alive():
        if stop_requested and time.monotonic() - stop_requested[0] > _STOP_GRACE_S:
            _err.print(f"vLLM still running {_STOP_GRACE_S:.0f}s after SIGTERM: killing its process group")
            break
        time.sleep(0.2)
    code = server.terminate(grace_s=0)
    _err.print(f"vLLM exited with code {code}")
    if stop_requested or code == 0:
        shutil.rmtree(workdir, ignore_errors=True)  # caches and sockets; the log too unless --log was given
    raise typer.Exit(0 if stop_requested else (code or 0))


@app.command("tiny-model")
def tiny_model(
    out_dir: Annotated[Path, typer.Argument(help="where to write the model")] = REPO_ROOT / ".tiergate" / "tiny-llama",
    seed: int = 0,
) -> None:
    """Build the tiny random Llama used by tests and cpu-tiny.yaml (runs in the vLLM virtualenv)."""
    python = vllm_python()
    if python is None:
        _err.print(f"[red]error[/red] {missing_reason()}")
        raise typer.Exit(2)
    script = Path(__file__).with_name("tiny_model.py")
    result = subprocess.run([str(python), str(script), str(out_dir), "--seed", str(seed)], check=False)
    raise typer.Exit(result.returncode)


def main() -> None:  # pragma: no cover - console entry
    sys.exit(app())
