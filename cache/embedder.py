"""Sentence embeddings with onnxruntime + tokenizers (no torch at run time).

Loads the folder written by `cache.training.export` (`model.onnx` that already pools and normalises), or any
sentence-transformers folder / Hugging Face name that has an ONNX graph (`onnx/model.onnx` giving token
embeddings, pooled here). One intra-op thread: the cores are shared with the gateway and the edge node,
and under contention two threads were measured ~5x slower than one.

Texts that the tokenizer truncates are reported, because two long prompts that differ only after the
cut would embed identically: the cache must not use such an embedding for a semantic hit.

Tested in `tests/cache/test_embedder_batcher.py`.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["EmbedderError", "Embedding", "OnnxEmbedder", "clean_text", "resolve_embedder_path"]

_MODEL_CANDIDATES = ("model.onnx", "onnx/model.onnx", "model_quantized.onnx", "onnx/model_quantized.onnx")


class EmbedderError(RuntimeError):
    """The embedder cannot be loaded; the message says what to do about it."""


@dataclass(frozen=True, slots=True)
class Embedding:
    vectors: np.ndarray  # (n, dim) float32, L2-normalised rows
    truncated: np.ndarray  # (n,) bool: the text was longer than the model's window


def clean_text(text: object) -> str:
    """Any prompt content as a valid UTF-8 `str` (lone surrogates and undecodable bytes replaced)."""
    if isinstance(text, bytes | bytearray | memoryview):
        return bytes(text).decode("utf-8", "replace")
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return "".join("\ufffd" if "\ud800" <= ch <= "\udfff" else ch for ch in text)


def resolve_embedder_path(path_or_name: str | os.PathLike[str]) -> Path:
    """A local folder as is; otherwise a Hugging Face model name, from the local cache or the Hub.

    Fails with a message naming the fix (export one offline) instead of a network stack trace.
    """
    p = Path(path_or_name).expanduser()
    if p.is_dir():
        return p
    name = str(path_or_name)
    if p.exists() or name.startswith((".", "/", "~")) or name.count("/") != 1:
        raise EmbedderError(
            f"embedder {name!r} is not a folder; run `tiergate cache export-embedder` to create "
            "the default one, or pass a sentence-transformers folder with an ONNX model"
        )
    try:
        from huggingface_hub import snapshot_download  # optional dependency: only for a Hugging Face name
    except ImportError as exc:  # pragma: no cover - huggingface_hub comes with tokenizers
        raise EmbedderError("loading an embedder by Hugging Face name needs huggingface_hub") from exc
    patterns = ["*.json", "onnx/model.onnx", "model.onnx", "1_Pooling/*"]
    with contextlib.suppress(Exception):  # not in the local cache: try the Hub next
        return Path(snapshot_download(name, allow_patterns=patterns, local_files_only=True))
    try:
        return Path(snapshot_download(name, allow_patterns=patterns))
    except Exception as exc:
        raise EmbedderError(
            f"cannot fetch embedder {name!r} from the Hugging Face Hub ({type(exc).__name__}); "
            "this machine may be offline: run `tiergate cache export-embedder` and pass its folder "
            "(default .tiergate/embedder), or copy a sentence-transformers folder with onnx/model.onnx here"
        ) from exc


class OnnxEmbedder:
    """Synchronous, thread-confined embedder: call `embed` from one worker thread (see `cache.batcher`)."""

    def __init__(self, model_path: Path, tokenizer_path: Path, *, pooling: str = "mean",
                 max_length: int = 256, threads: int = 1, quantized: bool | None = None) -> None:
        import onnxruntime as ort  # start-up time: loaded only when an embedder is configured
        from tokenizers import Tokenizer  # start-up time, as onnxruntime above

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._session = ort.InferenceSession(str(model_path), opts, providers=["CPUExecutionProvider"])
        self._inputs = {i.name for i in self._session.get_inputs()}
        self._output = self._session.get_outputs()[0].name
        self._pooled = len(self._session.get_outputs()[0].shape) == 2
        tok = Tokenizer.from_file(str(tokenizer_path))
        tok.enable_truncation(max_length=max_length)
        pad_id = tok.token_to_id("[PAD]") or tok.token_to_id("<pad>") or 0
        pad_token = "[PAD]" if tok.token_to_id("[PAD]") is not None else (tok.id_to_token(pad_id) or "[PAD]")
        tok.enable_padding(pad_id=pad_id, pad_token=pad_token)
        self._tok = tok
        # Dynamic int8 quantisation scales activations per tensor, i.e. over the whole padded batch: a text's
        # vector would then depend on its batch-mates (cosine moved by up to ~0.01, enough to flip a hit).
        # Quantised graphs therefore run one text per call (measured: as fast as batching on one thread).
        if quantized is None:
            quantized = any(tag in model_path.name for tag in ("int8", "quant", "qint"))
        self.one_by_one = quantized
        self.pooling = pooling
        self.max_length = max_length
        self.dim = int(self._probe().shape[1])
        self.path = model_path.parent

    @classmethod
    def load(cls, path_or_name: str | os.PathLike[str], *, threads: int = 1) -> OnnxEmbedder:
        root = resolve_embedder_path(path_or_name)
        manifest = root / "embedder.json"
        meta = json.loads(manifest.read_text()) if manifest.is_file() else {}
        model = next((root / c for c in _MODEL_CANDIDATES if (root / c).is_file()), None)
        if model is None:
            raise EmbedderError(
                f"no ONNX model in {root} (looked for {', '.join(_MODEL_CANDIDATES)}); "
                "run `tiergate cache export-embedder --source DIR --out DIR` to make one"
            )
        tokenizer = root / "tokenizer.json"
        if not tokenizer.is_file():
            raise EmbedderError(f"no tokenizer.json in {root}")
        pooling = meta.get("pooling") or _pooling_from_st(root)
        max_length = int(meta.get("max_length") or _max_length_from_st(root))
        quantized = meta["quantization"] != "none" if "quantization" in meta else None
        return cls(model, tokenizer, pooling=pooling, max_length=max_length, threads=threads, quantized=quantized)

    def embed(self, texts: list[str]) -> Embedding:
        """Embed texts (together, padded to the longest, unless quantised); rows are L2-normalised float32."""
        if not texts:
            return Embedding(np.zeros((0, getattr(self, "dim", 0)), np.float32), np.zeros(0, bool))
        if self.one_by_one and len(texts) > 1:
            parts = [self._run([t]) for t in texts]
            return Embedding(np.concatenate([p.vectors for p in parts]),
                             np.concatenate([p.truncated for p in parts]))
        return self._run(texts)

    def _run(self, texts: list[str]) -> Embedding:
        encs = self._tok.encode_batch([clean_text(t) for t in texts])
        ids = np.asarray([e.ids for e in encs], dtype=np.int64)
        mask = np.asarray([e.attention_mask for e in encs], dtype=np.int64)
        truncated = np.asarray([bool(e.overflowing) for e in encs], dtype=bool)
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        out = self._session.run([self._output], feeds)[0]
        if not self._pooled:
            if self.pooling == "cls":
                out = out[:, 0]
            else:
                m = mask[..., None].astype(out.dtype)
                out = (out * m).sum(1) / np.maximum(m.sum(1), 1e-9)
        out = np.asarray(out, dtype=np.float32)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return Embedding(out / np.maximum(norms, 1e-12), truncated)

    def token_count(self, text: str) -> int:
        return len(self._tok.encode(clean_text(text)).ids)

    def window_counts(self, texts: list[str]) -> list[int | None]:
        """Each text's tokens as the model reads them (special tokens included), or None for a text longer than
        the model's window: embedding it would drop its end (`/v1/embeddings` refuses such a text)."""
        encs = self._tok.encode_batch([clean_text(t) for t in texts])
        return [None if e.overflowing else sum(e.attention_mask) for e in encs]

    def _probe(self) -> np.ndarray:
        return self.embed(["tiergate"]).vectors


def _pooling_from_st(root: Path) -> str:
    cfg = root / "1_Pooling" / "config.json"
    if cfg.is_file() and json.loads(cfg.read_text()).get("pooling_mode_cls_token"):
        return "cls"
    return "mean"


def _max_length_from_st(root: Path) -> int:
    cfg = root / "sentence_bert_config.json"
    if cfg.is_file():
        return int(json.loads(cfg.read_text()).get("max_seq_length", 256))
    return 256
