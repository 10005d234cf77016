"""`edge-node serve` refuses, before loading anything, to serve an open API where other machines can reach it, and
checks its key and TLS options (issue 39, item 3). Real `python -m tiergate.edge_node` processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.tls import self_signed

KEY = "node-api-key-0123456789"


def serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`edge-node serve` on a model file that does not exist: exit 1 ("no such model") means every check passed."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TIERGATE_EDGE_")}
    return subprocess.run([sys.executable, "-m", "tiergate.edge_node", "serve", "--model", "/nonexistent/m.gguf",
                           "--log-format", "console", *args], capture_output=True, text=True, timeout=120,
                          env=clean | (env or {}))


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "edge.example.com"])
def test_a_node_bound_off_loopback_without_a_key_refuses_to_start(host):
    proc = serve("--host", host)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"edge-node: error: --host {host} is not a loopback address"), proc.stderr
    assert "--node-key" in proc.stderr and "--api-key" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("args, env", [
    (["--host", "0.0.0.0", "--api-key", KEY], {}),
    (["--host", "0.0.0.0"], {"TIERGATE_EDGE_API_KEY": KEY}),
    (["--host", "0.0.0.0"], {"TIERGATE_EDGE_NODE_KEY": KEY}),
    (["--host", "127.0.0.1"], {}),  # loopback: an open API is this machine's business
    (["--host", "::1"], {}),
])
def test_with_a_key_or_on_loopback_it_goes_on_to_load_the_model(args, env):
    proc = serve(*args, env=env)
    assert proc.returncode == 1 and "/nonexistent/m.gguf" in proc.stderr, proc.stderr


@pytest.mark.parametrize("args, says", [
    (["--host", "0.0.0.0", "--api-key", "short"], "--api-key: a key is at least 16"),
    (["--node-key", "has a space 0123456789"], "--node-key: a key is at least 16"),
    (["--ssl-certfile", "/nonexistent.pem"], "--ssl-certfile and --ssl-keyfile go together"),
    (["--ssl-certfile", "/nonexistent.pem", "--ssl-keyfile", "/nonexistent.key"], "cannot load"),
    (["--gateway-ca-file", "/nonexistent.pem"], "--gateway-ca-file"),
    (["--node-id", "bad id"], "--node-id 'bad id'"),
])
def test_bad_key_and_tls_options_are_usage_errors(args, says):
    proc = serve(*args)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr


def test_a_certificate_and_its_key_are_accepted(tmp_path: Path):
    tls = self_signed(tmp_path)
    proc = serve("--ssl-certfile", str(tls.cert), "--ssl-keyfile", str(tls.key), "--gateway-ca-file", str(tls.cert))
    assert proc.returncode == 1 and "/nonexistent/m.gguf" in proc.stderr, proc.stderr
