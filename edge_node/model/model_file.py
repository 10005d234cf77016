"""Check a GGUF file before llama.cpp sees it, so bad input gets one clear line instead of a crash.

llama.cpp's loader answers a missing, truncated or foreign file with a NULL pointer and some stderr,
and a model larger than memory with swapping or the OOM killer. Reading the GGUF header here (with the
`gguf` package) catches the first kind and gives the numbers to estimate memory for the second.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import gguf

__all__ = ["GGUFInfo", "ModelFileError", "available_memory", "check_gguf", "check_memory"]

_GGUF_MAGIC = b"GGUF"


class ModelFileError(RuntimeError):
    """The model file cannot be used; the message is one line that says why."""


@dataclass(frozen=True, slots=True)
class GGUFInfo:
    path: Path
    size_bytes: int
    architecture: str
    name: str | None
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ctx_train: int
    chat_template: str | None

    def kv_bytes(self, n_cells: int, bytes_per_value: int = 2) -> int:
        """KV cache size for n_cells token positions (F16 K and V)."""
        head_dim = self.n_embd // max(self.n_head, 1)
        return 2 * self.n_layer * n_cells * head_dim * self.n_head_kv * bytes_per_value


def _field(reader: gguf.GGUFReader, key: str) -> str | int | float | None:
    """A scalar metadata value: the text of a STRING field, else the first number; None if absent or odd."""
    f = reader.fields.get(key)
    if f is None or not f.data:
        return None
    part = f.parts[f.data[0]]
    try:
        if f.types and f.types[0].name == "STRING":
            return bytes(part).decode("utf-8", errors="replace")
        value: int | float = part.tolist()[0]  # a numeric field's parts are numpy arrays of numbers
        return value
    except Exception:  # noqa: BLE001 - an odd field type is treated as absent
        return None


def _text_field(reader: gguf.GGUFReader, key: str) -> str | None:
    """A metadata value that GGUF defines as a string; a number there is treated as absent."""
    value = _field(reader, key)
    return value if isinstance(value, str) else None


def check_gguf(path: str | os.PathLike[str]) -> GGUFInfo:
    """Validate that `path` is a readable, complete GGUF file and return what the edge node needs."""
    p = Path(path)
    if not p.exists():
        raise ModelFileError(f"model file not found: {p}")
    if not p.is_file():
        raise ModelFileError(f"model path is not a file: {p}")
    try:
        with p.open("rb") as fh:
            magic = fh.read(4)
    except OSError as e:
        raise ModelFileError(f"cannot read model file {p}: {e.strerror or e}") from None
    if magic != _GGUF_MAGIC:
        raise ModelFileError(f"not a GGUF model file (bad magic {magic!r}): {p}")
    try:
        reader = gguf.GGUFReader(str(p), "r")
        size = p.stat().st_size
        end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    except Exception as e:  # noqa: BLE001 - the reader raises ValueError/IndexError/... on damaged headers
        raise ModelFileError(f"corrupt GGUF model file {p}: {type(e).__name__}: {e}".splitlines()[0]) from None
    if end > size or not reader.tensors:
        raise ModelFileError(f"corrupt GGUF model file {p}: truncated ({size} bytes, tensors need {end})")
    arch = _text_field(reader, "general.architecture") or "unknown"

    def num(key: str, default: int = 0) -> int:
        v = _field(reader, f"{arch}.{key}")
        return int(v) if isinstance(v, (int, float)) else default

    n_head = num("attention.head_count", 1)
    return GGUFInfo(
        path=p,
        size_bytes=size,
        architecture=arch,
        name=_text_field(reader, "general.name"),
        n_layer=num("block_count"),
        n_embd=num("embedding_length"),
        n_head=n_head,
        n_head_kv=num("attention.head_count_kv", n_head),
        n_ctx_train=num("context_length"),
        chat_template=_text_field(reader, "tokenizer.chat_template"),
    )


def available_memory() -> int:
    """Bytes of memory available to a new process (MemAvailable), or a large number if unknown."""
    try:
        import psutil  # optional dependency: the edge extra

        return int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - no psutil: read /proc/meminfo
        try:
            with open("/proc/meminfo") as fh:
                for line in fh:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
    return 1 << 62


def check_memory(info: GGUFInfo, n_cells: int, available: int | None = None, gpu_layers: int = 0) -> int:
    """Raise ModelFileError when weights + KV cache cannot fit; returns the estimate in bytes.

    Layers offloaded to a GPU do not count against host memory; a negative `gpu_layers` means all of them,
    as llama.cpp's `--n-gpu-layers -1` does (the caller passes 0 when this build cannot offload at all).
    """
    avail = available_memory() if available is None else available
    if gpu_layers < 0:
        gpu_layers = info.n_layer
    frac_host = 1.0 if gpu_layers == 0 else max(0.0, 1.0 - gpu_layers / max(info.n_layer, 1))
    weights = int(info.size_bytes * frac_host)
    kv = int(info.kv_bytes(n_cells) * frac_host)
    need = int((weights + kv) * 1.1) + (64 << 20)  # compute buffers and slack
    if need > avail:
        gib = 1 << 30
        raise ModelFileError(
            f"model too large for memory: needs ~{need / gib:.1f} GiB (weights {weights / gib:.1f} GiB"
            f" + KV cache {kv / gib:.1f} GiB for {n_cells} tokens) but only {avail / gib:.1f} GiB is"
            " available; use a smaller quantization or lower --ctx/--parallel"
        )
    return need
