"""F16/F32 GGUF → 4-bit GGUF with llama.cpp's own quantizer (`llama_model_quantize`).

Using llama.cpp's quantizer, not a numpy re-implementation, means K-quants (Q4_K_M) are available
and the output is exactly what llama.cpp expects. The C call has no progress hook, so progress comes
from its per-tensor log lines ("[  3/ 28] blk.0.attn_q.weight ...").
"""

from __future__ import annotations

import ctypes
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tiergate.edge_node.engine.llama_log import LlamaLogBridge
from tiergate.edge_node.model.model_file import ModelFileError, check_gguf

__all__ = ["QUANT_TYPES", "QuantizeError", "quantize"]

QUANT_TYPES: MappingProxyType[str, str] = MappingProxyType(
    {"q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M"}
)
_TENSOR_LINE = re.compile(r"^\[\s*(\d+)/\s*(\d+)\]\s+(\S+)")


class QuantizeError(RuntimeError):
    """A one-line reason the quantization could not be done."""


def quantize(
    src: str | Path,
    dst: str | Path,
    qtype: str = "q4_k_m",
    *,
    show_progress: bool = True,
    threads: int = 1,
) -> Path:
    """Quantize `src` (F16/F32 GGUF) into `dst`. Raises QuantizeError with a clear one-line message."""
    qtype = qtype.lower()
    if qtype not in QUANT_TYPES:
        raise QuantizeError(f"unknown quantization type {qtype!r}: choose one of {', '.join(QUANT_TYPES)}")
    src_p, dst_p = Path(src), Path(dst)
    try:
        check_gguf(src_p)
    except ModelFileError as e:
        raise QuantizeError(str(e)) from None
    if dst_p.resolve() == src_p.resolve():
        raise QuantizeError("output path must differ from the input path")
    if not dst_p.parent.exists():
        raise QuantizeError(f"output directory does not exist: {dst_p.parent}")

    try:
        import llama_cpp  # optional dependency: the edge extra
    except ImportError:
        raise QuantizeError(
            "llama-cpp-python is not installed: pip install 'tiergate[edge]'"
        ) from None
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, QUANT_TYPES[qtype])
    params.nthread = max(1, threads)
    result: dict[str, int] = {}

    def run() -> None:
        result["rc"] = llama_cpp.llama_model_quantize(
            os.fsencode(src_p), os.fsencode(dst_p), ctypes.byref(params)
        )

    with LlamaLogBridge() as bridge:
        if show_progress:
            _run_with_progress(run, bridge, f"{src_p.name} → {qtype.upper()}")
        else:
            run()
        rc = result.get("rc", -1)
        if rc != 0:
            reason = bridge.last_error() or "see the llama.cpp log above"
            dst_p.unlink(missing_ok=True)
            raise QuantizeError(f"llama.cpp could not quantize {src_p.name}: {reason}")
    return dst_p


def _run_with_progress(run: Callable[[], None], bridge: LlamaLogBridge, title: str) -> None:
    """Run the blocking C call in a thread while a rich progress bar follows its per-tensor log lines."""
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[tensor]}"),
    ) as progress:
        task = progress.add_task(title, total=None, tensor="")

        def on_line(line: str) -> None:
            m = _TENSOR_LINE.match(line)
            if m:
                progress.update(task, completed=int(m.group(1)), total=int(m.group(2)), tensor=m.group(3))

        bridge.add_listener(on_line)
        worker = threading.Thread(target=run, name="quantize", daemon=True)
        worker.start()
        worker.join()
        bridge.remove_listener(on_line)
