"""No file in deploy/ starts an edge node or a vLLM server on an address other than loopback without its key
(issue 39, item 3), and the gateway is given the keys to present.

Each file that starts one is checked the way it starts it: docker-compose (its rendered config), the Dockerfile's
edge image (its CMD run through the real `edge-node serve`, which must refuse without a key), the systemd unit with
its example env file (the same), and every `edge-node serve` in deploy/jetson.md. The Helm chart's vLLM pods are
checked in `test_helm_chart.py`. A new file that starts either server fails `test_every_file_that_starts_a_server_is_
checked` until it is checked here.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.deploy.test_compose_docker_systemd import (
    COMPOSE_ENV,
    DEPLOY,
    ENV_EXAMPLE,
    _compose_config,
    _unit_exec_start,
)
from tiergate.core.edge_identity import is_loopback, node_key
from tiergate.policies.loader import load_policy

KEY_ENV = ("TIERGATE_EDGE_NODE_KEY", "TIERGATE_EDGE_API_KEY")
KEY_FLAGS = ("--node-key", "--api-key")
# deploy/ files that start an edge node or a vLLM server, and the ones that only mention one
STARTERS = {"Dockerfile", "docker-compose.yml", "jetson.md", "systemd/edge-node.service",
            "helm/tiergate/templates/vllm.yaml"}
MENTIONS = {"compose/policy.yaml", "grafana/tiergate.json", "systemd/edge-node.env.example"}
_STARTS = re.compile(r'edge-node(\s|\\\n)+serve|ENTRYPOINT \["edge-node"\]|\["vllm", "serve"\]|"vllm" "serve"|'
                     r"vllm serve")


def _flag(argv: list[str], name: str, default: str) -> str:
    return argv[argv.index(name) + 1] if name in argv else default


def _edge_is_authenticated(argv: list[str], env: dict[str, str]) -> bool:
    host = _flag(argv, "--host", "127.0.0.1")
    return is_loopback(host) or any(f in argv for f in KEY_FLAGS) or any(env.get(k) for k in KEY_ENV)


def _serve(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The real `edge-node serve` with these flags (the model does not exist here: exit 1 means every other check
    passed, exit 2 that it refused)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TIERGATE_EDGE_")}
    return subprocess.run([sys.executable, "-m", "tiergate.edge_node", *argv], capture_output=True, text=True,
                          timeout=120, env=clean | env)


def test_every_file_that_starts_a_server_is_checked():
    found = {str(f.relative_to(DEPLOY)) for f in DEPLOY.rglob("*")
             if f.is_file() and _STARTS.search(f.read_text(errors="replace"))}
    assert found == STARTERS | MENTIONS, f"check how these start servers, then list them: {found ^ (STARTERS | MENTIONS)}"


def test_compose_starts_the_edge_node_and_vllm_behind_their_keys(tmp_path: Path):
    config = yaml.safe_load(_compose_config(tmp_path, COMPOSE_ENV).stdout)
    services = config["services"]
    edge = services["edge"]
    assert _flag(edge["command"], "--host", "") == "0.0.0.0"
    assert _edge_is_authenticated(edge["command"], edge["environment"])
    vllm = services["vllm"]
    argv = [*vllm["entrypoint"], *vllm["command"]]
    assert not is_loopback(_flag(argv, "--host", "0.0.0.0"))
    assert vllm["environment"]["VLLM_API_KEY"] == COMPOSE_ENV["VLLM_API_KEY"]
    # the gateway presents the same key: the policy's cloud tier names the variable compose gives it
    cloud = load_policy(DEPLOY / "compose" / "policy.yaml").tiers["cloud"]
    assert services["gateway"]["environment"][cloud.api_key_env] == COMPOSE_ENV["VLLM_API_KEY"]
    for missing in ("EDGE_NODE_KEY", "VLLM_API_KEY", "TIERGATE_EDGE_SECRET"):
        proc = _compose_config(tmp_path, {k: v for k, v in COMPOSE_ENV.items() if k != missing})
        assert proc.returncode != 0 and f"set {missing}" in proc.stderr, (missing, proc.stderr)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl")
def test_the_compose_recipe_for_the_node_key_computes_the_gateways(tmp_path: Path):
    (recipe,) = [ln.split("=", 1)[1][2:-1] for ln in (DEPLOY / "docker-compose.yml").read_text().splitlines()
                 if ln.startswith("#   export EDGE_NODE_KEY=$(")]
    secret = COMPOSE_ENV["TIERGATE_EDGE_SECRET"]
    out = subprocess.run(["bash", "-c", recipe], capture_output=True, text=True, check=True,
                         env={"PATH": os.environ["PATH"], "TIERGATE_EDGE_SECRET": secret}).stdout.strip()
    assert out == node_key(secret, "edge-1")


def test_the_edge_image_refuses_its_public_cmd_without_a_key():
    text = (DEPLOY / "Dockerfile").read_text().split("AS edge\n")[-1]
    cmd = [a.strip().strip('"') for a in re.search(r'^CMD \[(.+)\]$', text, flags=re.MULTILINE).group(1).split(",")]
    assert not is_loopback(_flag(cmd, "--host", "127.0.0.1"))
    assert not re.search(r"^ENV .*TIERGATE_EDGE_(NODE|API)_KEY", text, flags=re.MULTILINE)  # no key baked in
    refused = _serve(cmd, {})
    assert refused.returncode == 2 and "is not a loopback address" in refused.stderr, refused.stderr
    started = _serve(cmd, {"TIERGATE_EDGE_NODE_KEY": "k" * 32})
    assert started.returncode == 1 and "/models/model.gguf" in started.stderr, started.stderr


def test_the_systemd_unit_serves_behind_the_node_key_of_its_env_file():
    env = dict(ln.split("=", 1) for ln in ENV_EXAMPLE.read_text().splitlines() if ln and not ln.startswith("#"))
    # ${EDGE_HOST} and friends, from the env file
    argv = [re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), ""), a) for a in _unit_exec_start()][1:]
    argv = [a for a in argv if a]
    assert _flag(argv, "--host", "") == "0.0.0.0" and env["TIERGATE_EDGE_NODE_KEY"]
    assert _edge_is_authenticated(argv, env)
    # the example's placeholder is not a key: the unit does not start until it is replaced
    placeholder = _serve(argv, {"TIERGATE_EDGE_NODE_KEY": env["TIERGATE_EDGE_NODE_KEY"]})
    assert placeholder.returncode == 2 and "--node-key" in placeholder.stderr, placeholder.stderr
    assert _serve(argv, {}).returncode == 2
    assert _serve(argv, {"TIERGATE_EDGE_NODE_KEY": "k" * 64}).returncode == 1


def _shell_commands(markdown: str) -> list[list[str]]:
    """Every command line in the markdown's bash blocks, continuation lines joined."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", markdown, flags=re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                out.append(shlex.split(line))
    return out


def test_jetson_guide_serves_behind_the_node_key_and_over_tls():
    serves = [argv for argv in _shell_commands((DEPLOY / "jetson.md").read_text()) if "serve" in argv
              and any(a.endswith("edge-node") for a in argv)]
    assert serves
    for argv in serves:
        env = dict(a.split("=", 1) for a in argv if re.fullmatch(r"[A-Z_]+=.*", a))
        assert _edge_is_authenticated(argv, env), argv
        assert "--ssl-certfile" in argv and "--ssl-keyfile" in argv, argv
