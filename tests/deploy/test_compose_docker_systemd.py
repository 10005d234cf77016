"""docker-compose, the Dockerfile and the edge-node systemd unit: valid for their tools, and in step with the code.

The images are not built here (no container runtime, no access to base images); what is checked is what
can go stale silently: files the Dockerfile copies, console scripts it runs, flags the compose file and
the unit pass to `edge-node serve` and vLLM, and settings they give the gateway.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest
import typer
import yaml
from pydantic import ValidationError

from tests.support.tools import require_tool
from tiergate.core.edge_identity import node_key
from tiergate.gateway.settings import Settings
from tiergate.policies.loader import load_policy

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
UNIT = DEPLOY / "systemd" / "edge-node.service"
ENV_EXAMPLE = DEPLOY / "systemd" / "edge-node.env.example"
EDGE_SECRET = "compose-edge-secret-0123456789abcdef"
COMPOSE_ENV = {"TIERGATE_ADMIN_KEY": "admin-test", "TIERGATE_EDGE_SECRET": EDGE_SECRET,
               "EDGE_NODE_KEY": node_key(EDGE_SECRET, "edge-1"), "VLLM_API_KEY": "vllm-test-key-0123",
               "TIERGATE_API_KEYS": "compose-key-1=team:normal"}


def _edge_serve_options() -> set[str]:
    """Every option `edge-node serve` accepts, read from its click command (not from help text)."""
    # optional dependency: edge_node.cli imports llama-cpp-python (the edge extra) and loads libllama;
    # the rest of this module checks files and runs without it
    from tiergate.edge_node.cli import app

    serve = typer.main.get_command(app).commands["serve"]
    return {opt for p in serve.params for opt in (*p.opts, *p.secondary_opts)}


def _gateway_settings() -> set[str]:
    return {f"TIERGATE_{name.upper()}" for name in Settings.model_fields}


# ---- docker-compose --------------------------------------------------------------------------------------------

def _compose_config(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    compose = require_tool("docker-compose", "apt-get install --no-install-recommends docker-compose")
    return subprocess.run([compose, "-f", str(COMPOSE), "config"], capture_output=True, text=True, cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **env})


def test_compose_file_is_valid_and_refuses_to_start_without_secrets(tmp_path: Path):
    ok = _compose_config(tmp_path, COMPOSE_ENV)
    assert ok.returncode == 0, ok.stderr
    config = yaml.safe_load(ok.stdout)
    assert set(config["services"]) == {"gateway", "redis", "edge", "vllm"}
    missing = _compose_config(tmp_path, {})
    assert missing.returncode != 0 and "TIERGATE_ADMIN_KEY" in missing.stderr


def test_compose_requires_api_keys_and_never_serves_the_demo_key(tmp_path: Path, monkeypatch):
    """The published gateway port needs real keys: compose refuses to start without TIERGATE_API_KEYS (or with
    it empty), turns the demo key off, and the gateway would refuse the environment compose gives it (the
    image's TIERGATE_HOST=0.0.0.0 included) if the keys were taken away."""
    for env in ({k: v for k, v in COMPOSE_ENV.items() if k != "TIERGATE_API_KEYS"},
                COMPOSE_ENV | {"TIERGATE_API_KEYS": ""}):
        refused = _compose_config(tmp_path, env)
        assert refused.returncode != 0 and "set TIERGATE_API_KEYS" in refused.stderr, refused.stderr
    gw_env = yaml.safe_load(_compose_config(tmp_path, COMPOSE_ENV).stdout)["services"]["gateway"]["environment"]
    assert gw_env["TIERGATE_API_KEYS"] == COMPOSE_ENV["TIERGATE_API_KEYS"] and gw_env["TIERGATE_DEMO_KEY"] == "false"
    image_env = dict(re.findall(r"(TIERGATE_[A-Z_]+)=(\S+)", (DEPLOY / "Dockerfile").read_text().split(
        "AS gateway\n")[-1].split("FROM")[0]))
    assert image_env["TIERGATE_HOST"] == "0.0.0.0"
    for name in Settings.model_fields:  # only what the image and compose set
        monkeypatch.delenv(f"TIERGATE_{name.upper()}", raising=False)
    for name, value in (image_env | gw_env).items():
        monkeypatch.setenv(name, str(value))
    assert Settings().host == "0.0.0.0"  # as compose runs it: keys, no demo key
    monkeypatch.delenv("TIERGATE_API_KEYS")
    monkeypatch.delenv("TIERGATE_DEMO_KEY")
    with pytest.raises(ValidationError, match="TIERGATE_DEMO_KEY"):
        Settings()


def test_compose_validation_is_not_vacuous(tmp_path: Path):
    bad = tmp_path / "bad.yml"
    bad.write_text(COMPOSE.read_text().replace("    restart: unless-stopped\n", "    restarts: always\n", 1))
    compose = require_tool("docker-compose", "apt-get install --no-install-recommends docker-compose")
    proc = subprocess.run([compose, "-f", str(bad), "config", "-q"], capture_output=True, text=True, cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **COMPOSE_ENV})
    assert proc.returncode != 0 and "restarts" in proc.stderr


def test_compose_services_fit_together(tmp_path: Path):
    config = yaml.safe_load(_compose_config(tmp_path, COMPOSE_ENV).stdout)
    services = config["services"]
    gw_env = services["gateway"]["environment"]
    policy_keys = {t.api_key_env for t in load_policy(DEPLOY / "compose" / "policy.yaml").tiers.values()} - {None}
    assert set(gw_env) <= _gateway_settings() | policy_keys, set(gw_env) - _gateway_settings() - policy_keys
    assert gw_env["TIERGATE_REDIS_URL"] == "redis://redis:6379/0"
    # the policy is bind-mounted as a directory holding the file the gateway reads (edits are hot-reloaded)
    policy = Path(gw_env["TIERGATE_POLICY"])
    mounts = [v.split(":") for v in services["gateway"]["volumes"]]  # compose v1 prints short syntax
    (source,) = [m[0] for m in mounts if m[1] == str(policy.parent)]
    policy_file = Path(source) / policy.name
    assert policy_file == DEPLOY / "compose" / "policy.yaml" and policy_file.is_file()
    # the edge node registers with this gateway with the key of its id, with flags edge-node serve has
    edge = services["edge"]
    flags = {a for a in edge["command"] if a.startswith("--")}
    assert flags <= _edge_serve_options(), flags - _edge_serve_options()
    cmd = edge["command"]
    assert cmd[cmd.index("--gateway") + 1] == "http://gateway:8080"
    node_id = cmd[cmd.index("--node-id") + 1]
    assert edge["environment"]["TIERGATE_EDGE_NODE_KEY"] == node_key(gw_env["TIERGATE_EDGE_SECRET"], node_id)
    # vLLM gets a GPU reservation and serves the model name the policy's cloud tier expects
    vllm = services["vllm"]
    assert vllm["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    served = vllm["command"][vllm["command"].index("--served-model-name") + 1]
    assert f"model: {served}" in policy_file.read_text()


def test_compose_policy_loads(tmp_path: Path):
    policy = load_policy(DEPLOY / "compose" / "policy.yaml")
    assert {t.kind for t in policy.tiers.values()} == {"edge", "cloud"}


# ---- Dockerfile ------------------------------------------------------------------------------------------------

def test_dockerfile_stages_copies_and_entrypoints_exist():
    text = (DEPLOY / "Dockerfile").read_text()
    stages = set(re.findall(r"^FROM \S+ AS (\S+)$", text, flags=re.MULTILINE))
    assert {"gateway", "edge", "gateway-build", "edge-build", "embedder"} <= stages
    for src in re.findall(r"^COPY (?!--from)(.+) \S+$", text, flags=re.MULTILINE):
        for path in src.split():
            assert (REPO / path).exists(), f"COPY {path}: no such file in the repository"
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    for entry in re.findall(r'^ENTRYPOINT \["([^"]+)"\]', text, flags=re.MULTILINE):
        assert entry in scripts, f"ENTRYPOINT {entry} is not a console script of the project"
    pin = re.search(r"LLAMA_CPP_PYTHON_VERSION=(\S+)", text).group(1)
    edge_extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["edge"]
    assert f"llama-cpp-python=={pin}" in edge_extra, "the image builds another llama-cpp-python than the project pins"
    cmd = re.search(r'^CMD \["serve", (.+)\]$', text.split("AS edge\n")[-1], flags=re.MULTILINE).group(1)
    assert {a.strip('" ') for a in cmd.split(",") if a.strip().startswith('"--')} <= _edge_serve_options()
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().split()
    assert ".venv" in ignore and ".tiergate" in ignore


# ---- systemd ---------------------------------------------------------------------------------------------------

def _unit_exec_start() -> list[str]:
    text = UNIT.read_text().replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if ln.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart="))


def test_systemd_unit_verifies(tmp_path: Path):
    analyze = require_tool("systemd-analyze", "apt-get install systemd")
    edge_node = REPO / ".venv" / "bin" / "edge-node"
    unit = tmp_path / "edge-node.service"
    unit.write_text(UNIT.read_text().replace("/opt/tiergate/bin/edge-node", str(edge_node)))
    proc = subprocess.run([analyze, "verify", "--man=no", str(unit)], capture_output=True, text=True)
    complaints = [ln for ln in (proc.stdout + proc.stderr).splitlines() if str(unit) in ln or unit.name in ln]
    assert proc.returncode == 0 and not complaints, proc.stdout + proc.stderr
    # and the check bites: a misspelt key is reported
    unit.write_text(unit.read_text().replace("Restart=on-failure", "Restrt=on-failure"))
    proc = subprocess.run([analyze, "verify", "--man=no", str(unit)], capture_output=True, text=True)
    assert "Restrt" in proc.stderr


def test_systemd_unit_flags_and_variables_exist():
    argv = _unit_exec_start()
    assert argv[:2] == ["/opt/tiergate/bin/edge-node", "serve"]
    flags = {a for a in argv if a.startswith("--")}
    assert flags <= _edge_serve_options(), flags - _edge_serve_options()
    used = set(re.findall(r"\$\{?([A-Z_]+)\}?", " ".join(argv)))
    env = dict(ln.split("=", 1) for ln in ENV_EXAMPLE.read_text().splitlines() if ln and not ln.startswith("#"))
    assert used <= set(env), f"variables the unit uses but the example env file lacks: {used - set(env)}"
    assert "TIERGATE_EDGE_NODE_KEY" in env  # read by `edge-node serve --node-key` from the environment
    text = UNIT.read_text()
    timeout = int(re.search(r"^TimeoutStopSec=(\d+)", text, flags=re.MULTILINE).group(1))
    drain = float(argv[argv.index("--drain-timeout") + 1])
    assert timeout > drain, "systemd must not kill the node before its drain ends"
