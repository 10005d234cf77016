"""VllmProcess and `cloud-pool launch` against a stand-in server script (no vLLM needed).

The stand-in takes vLLM's command line, serves /health on --port, forks a child like vLLM's engine
core does, and exits on SIGTERM; one variant ignores SIGTERM to check the SIGKILL fallback.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tiergate.cloud_pool.process import UnauthenticatedBind, VllmProcess, VllmStartError, free_port
from tiergate.cloud_pool.spec import parse_spec

FAKE = textwrap.dedent("""
    import http.server, os, signal, sys, time
    args = sys.argv[1:]
    port = int(args[args.index("--port") + 1])
    mode = os.environ.get("FAKE_MODE", "ok")
    print("fake vllm starting", args, flush=True)
    if mode == "crash":
        sys.exit(3)
    child = os.fork()
    if child == 0:  # the 'engine core': sleeps until killed
        while True:
            time.sleep(1)
    with open(os.environ["FAKE_PIDS"], "w") as f:
        f.write(f"{os.getpid()} {child}")
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        def stop(*_):
            os.kill(child, signal.SIGTERM)
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
""")


@pytest.fixture
def fake_python(tmp_path: Path) -> Path:
    script = tmp_path / "fake_vllm.py"
    script.write_text(FAKE)
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {script} \"$@\"\n")
    wrapper.chmod(0o755)
    return wrapper


def spec_for(model_dir: Path):
    return parse_spec(f"name: fake\nmodel: {model_dir}\ndevice: cpu\nhost: 127.0.0.1\n")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still has a pid; it is gone for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def start(tmp_path: Path, fake_python: Path, mode: str) -> tuple[VllmProcess, Path]:
    pids = tmp_path / f"pids-{mode}"
    server = VllmProcess.from_spec(spec_for(tmp_path), tmp_path / f"work-{mode}", python=str(fake_python),
                                   port=free_port(), extra_env={"FAKE_MODE": mode, "FAKE_PIDS": str(pids)})
    return server, pids


def test_wait_then_terminate_stops_the_server_and_its_children(tmp_path: Path, fake_python: Path) -> None:
    server, pids = start(tmp_path, fake_python, "ok")
    server.wait_healthy(60)
    assert server.argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    main, child = map(int, pids.read_text().split())
    assert server.terminate(grace_s=30) == 0
    assert not alive(main) and not alive(child)
    assert "fake vllm starting" in server.log_tail()
    assert (tmp_path / "work-ok" / "rpc").is_dir(), "vLLM's IPC sockets go to the private work dir"


def test_a_server_that_ignores_sigterm_is_killed_with_its_group(tmp_path: Path, fake_python: Path) -> None:
    server, pids = start(tmp_path, fake_python, "stubborn")
    server.wait_healthy(60)
    main, child = map(int, pids.read_text().split())
    server.terminate(grace_s=0.5)
    assert server.proc.returncode == -signal.SIGKILL
    assert not alive(main) and not alive(child)


def test_kill_crashes_the_whole_group(tmp_path: Path, fake_python: Path) -> None:
    server, pids = start(tmp_path, fake_python, "ok")
    server.wait_healthy(60)
    main, child = map(int, pids.read_text().split())
    server.kill()
    assert not server.alive() and not server.healthy(timeout_s=0.5)
    assert not alive(main) and not alive(child)


def test_early_exit_is_reported_with_the_log_tail(tmp_path: Path, fake_python: Path) -> None:
    server, _ = start(tmp_path, fake_python, "crash")
    with pytest.raises(VllmStartError, match=r"(?s)exited with code 3.*fake vllm starting"):
        server.wait_healthy(60)
    server.terminate()


def test_cli_launch_shows_ready_and_forwards_sigterm(tmp_path: Path, fake_python: Path) -> None:
    spec_file = tmp_path / "spec.yaml"
    port = free_port()
    spec_file.write_text(f"name: fake\nmodel: {tmp_path}\ndevice: cpu\nhost: 127.0.0.1\nport: {port}\n")
    pids = tmp_path / "pids-cli"
    env = os.environ | {"TIERGATE_VLLM_PYTHON": str(fake_python), "FAKE_PIDS": str(pids), "COLUMNS": "200"}
    cli = subprocess.Popen([sys.executable, "-c", "from tiergate.cloud_pool.cli import app; app()", "launch", str(spec_file)],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = cli.stdout.readline()
            lines.append(line)
            if "ready" in line or not line:
                break
        assert any(f"ready http://127.0.0.1:{port}" in ln for ln in lines), lines
        main, child = map(int, pids.read_text().split())
        cli.send_signal(signal.SIGTERM)
        rest = cli.communicate(timeout=60)[0]
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode == 0
    assert "received SIGTERM: stopping vLLM" in rest
    assert not alive(main) and not alive(child)


def test_cli_launch_without_the_vllm_venv_says_how_to_get_it(tmp_path: Path) -> None:
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(f"name: fake\nmodel: {tmp_path}\ndevice: cpu\n")
    env = os.environ | {"TIERGATE_VLLM_PYTHON": str(tmp_path / "nope" / "python")}
    out = subprocess.run([sys.executable, "-c", "from tiergate.cloud_pool.cli import app; app()", "launch", str(spec_file)],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "scripts/setup-vllm.sh" in out.stdout + out.stderr


def test_a_server_bound_beyond_this_machine_needs_an_api_key(tmp_path: Path, fake_python: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Anyone who can reach an unauthenticated vLLM skips the gateway's keys and limits: refused before it starts."""
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    public = parse_spec(f"name: fake\nmodel: {tmp_path}\ndevice: cpu\nhost: 0.0.0.0\n")
    with pytest.raises(UnauthenticatedBind, match="VLLM_API_KEY"):
        VllmProcess.from_spec(public, tmp_path / "work", python=str(fake_python), port=free_port())
    assert not (tmp_path / "work" / "server.log").exists()  # nothing was started
    keyed = VllmProcess.from_spec(public, tmp_path / "work-keyed", python=str(fake_python), port=free_port(),
                                  extra_env={"VLLM_API_KEY": "k" * 24, "FAKE_MODE": "ok",
                                             "FAKE_PIDS": str(tmp_path / "pids")})
    try:
        keyed.wait_healthy(60)
    finally:
        keyed.terminate(grace_s=30)
