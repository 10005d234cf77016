"""`tiergate serve`: options and TIERGATE_* settings reach uvicorn (uvicorn itself is not started here), and
settings it must not serve with stop it before anything listens (a real `tiergate serve` process)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import uvicorn
from typer.testing import CliRunner

from tests.support.servers import free_port
from tiergate.gateway.cli import app


@pytest.fixture
def captured(monkeypatch) -> dict:
    seen: dict = {}
    monkeypatch.setattr(uvicorn, "run", lambda target, **kw: seen.update(target=target, **kw))
    # `serve` writes its options into os.environ: set-then-delete makes monkeypatch restore each one
    # (as unset) afterwards, so nothing leaks into later tests that start gateways.
    for name in ("HOST", "PORT", "POLICY", "REDIS_URL", "EMBEDDER", "WORKERS", "API_KEYS", "API_KEYS_FILE", "DEMO_KEY"):
        monkeypatch.setenv(f"TIERGATE_{name}", "")
        monkeypatch.delenv(f"TIERGATE_{name}")
    return seen


def test_workers_come_from_the_environment(captured, monkeypatch):
    monkeypatch.setenv("TIERGATE_WORKERS", "3")
    result = CliRunner().invoke(app, ["serve", "--port", "18099"])
    assert result.exit_code == 0, result.output
    assert captured["workers"] == 3 and captured["port"] == 18099 and captured["target"] == "tiergate.gateway.main:app"


def test_the_workers_option_overrides_the_environment(captured, monkeypatch):
    monkeypatch.setenv("TIERGATE_WORKERS", "3")
    result = CliRunner().invoke(app, ["serve", "--workers", "2"])
    assert result.exit_code == 0, result.output
    assert captured["workers"] == 2


def test_a_broken_policy_stops_serve_with_the_error(captured, tmp_path):
    bad = tmp_path / "policy.yaml"
    bad.write_text("version: 1\ntiers: {}\nrules: [\n")
    result = CliRunner().invoke(app, ["serve", "--policy", str(bad), "--workers", "2"])
    assert result.exit_code == 2
    assert str(bad) in result.output and captured == {}


def test_a_verifier_that_cannot_be_loaded_stops_serve_with_the_file_and_what_to_do(captured, tmp_path, monkeypatch):
    monkeypatch.setenv("TIERGATE_CACHE_VERIFIER", str(tmp_path / "verifier"))
    result = CliRunner().invoke(app, ["serve", "--workers", "2"])
    assert result.exit_code == 2 and captured == {}
    assert f"TIERGATE_CACHE_VERIFIER: {tmp_path / 'verifier' / 'verifier.json'} is missing" in result.output
    assert "tiergate cache train-verifier" in result.output
    monkeypatch.setenv("TIERGATE_CACHE", "false")  # no cache, nothing to verify: it starts
    assert CliRunner().invoke(app, ["serve", "--workers", "2"]).exit_code == 0


def test_serve_refuses_the_demo_key_on_a_public_bind_address_before_listening():
    """A real `tiergate serve --host 0.0.0.0` with no keys configured: exit 2 with one line naming the settings
    and what to do, and nothing ever listens on its port."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERGATE_")} | {"TIERGATE_PORT": str(port)}
    proc = subprocess.run([sys.executable, "-m", "tiergate.gateway.cli", "serve", "--host", "0.0.0.0"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: TIERGATE_DEMO_KEY: the public demo key `tg-demo-key`"), proc.stderr
    assert "TIERGATE_HOST='0.0.0.0'" in proc.stderr and "TIERGATE_API_KEYS" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0  # never listened


@pytest.mark.parametrize("env", [{"TIERGATE_API_KEYS": "k-123456=alpha"}, {"TIERGATE_DEMO_KEY": "false"}])
def test_serve_binds_a_public_address_with_keys_or_without_the_demo_key(captured, monkeypatch, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = CliRunner().invoke(app, ["serve", "--host", "0.0.0.0", "--workers", "2"])
    assert result.exit_code == 0, result.output
    assert captured["host"] == "0.0.0.0"


def test_serve_names_the_variable_of_any_setting_it_cannot_read(captured, monkeypatch):
    monkeypatch.setenv("TIERGATE_WORKERS", "many")
    result = CliRunner().invoke(app, ["serve"])
    assert result.exit_code == 2 and captured == {}
    assert "error: TIERGATE_WORKERS: Input should be a valid integer" in result.output


def test_uvicorn_never_rewrites_the_peer_from_proxy_headers(captured, monkeypatch):
    """The edge registration's "from this machine" check reads the ASGI scope's client: it must stay the socket's
    peer, never an address a client wrote into X-Forwarded-For (gateway.edge_auth)."""
    monkeypatch.setenv("TIERGATE_WORKERS", "2")
    assert CliRunner().invoke(app, ["serve"]).exit_code == 0
    assert captured["proxy_headers"] is False
    configs: list[uvicorn.Config] = []

    class FakeServer:
        def __init__(self, config, *_args) -> None:
            configs.append(config)

        def run(self) -> None:
            pass

    monkeypatch.setattr("tiergate.gateway.cli.DrainingServer", FakeServer)
    monkeypatch.setenv("TIERGATE_WORKERS", "1")
    result = CliRunner().invoke(app, ["serve"])
    assert result.exit_code == 0, result.output
    assert [c.proxy_headers for c in configs] == [False]


def test_edge_node_key_prints_a_nodes_key_from_the_secret(monkeypatch):
    from tiergate.core.edge_identity import node_api_key, node_key

    secret = "gateway-edge-secret-0123456789abcdef"
    monkeypatch.setenv("TIERGATE_EDGE_SECRET", secret)
    result = CliRunner().invoke(app, ["edge", "node-key", "jetson-01"])
    assert result.exit_code == 0, result.output
    key = node_key(secret, "jetson-01")
    assert f"TIERGATE_EDGE_NODE_KEY={key}\n" in result.output and node_api_key(key) in result.output
    monkeypatch.setenv("TIERGATE_EDGE_SECRET", "short")
    short = CliRunner().invoke(app, ["edge", "node-key", "jetson-01"])
    assert short.exit_code == 2 and "TIERGATE_EDGE_SECRET" in short.output
    monkeypatch.setenv("TIERGATE_EDGE_SECRET", secret)
    assert CliRunner().invoke(app, ["edge", "node-key", "bad id"]).exit_code == 2
