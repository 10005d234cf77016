"""One loaded GGUF model and its llama.cpp context, behind a small typed surface.

Everything here is llama-cpp-python's low-level (ctypes) API: the high-level `Llama` class owns a
single sequence and samples in Python, which is what the engine replaces. The runtime only loads,
tokenizes, and answers questions about the vocabulary; the decode loop lives in `edge_node.engine.engine`.

Tested in `tests/edge_node/engine/test_engine.py`, `tests/edge_node/server/test_app.py`.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import structlog

from tiergate.edge_node.engine.gilcalls import GilCalls
from tiergate.edge_node.engine.llama_log import LlamaLogBridge
from tiergate.edge_node.model.model_file import GGUFInfo, ModelFileError, check_gguf, check_memory
from tiergate.edge_node.server.chat import BuiltinTemplate, ChatTemplate, choose_template

if TYPE_CHECKING:  # llama.cpp's opaque handles, as llama-cpp-python types them (it ships py.typed)
    from llama_cpp import llama_adapter_lora_p, llama_context_p, llama_memory_t, llama_model_p, llama_vocab_p

__all__ = ["LlamaRuntime", "ModelLoadError", "RuntimeConfig"]

log = structlog.get_logger("edge_node.runtime")


class ModelLoadError(ModelFileError):
    """llama.cpp refused the model or the context; one line, says why when llama.cpp did."""


@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    model_path: Path
    ctx_per_seq: int = 2048  # the longest request (prompt + completion) one slot can hold
    parallel: int = 4  # sequences decoded together (slots)
    n_batch: int = 512  # tokens per llama_decode (prefill chunk + one per generating slot)
    threads: int = 1
    n_gpu_layers: int = 0
    kv_unified: bool = False  # separate KV streams per slot: attention only over a slot's own tokens
    check_memory: bool = True
    lora_path: Path | None = None  # a GGUF LoRA adapter applied over the model to every slot (`--lora`)


class LlamaRuntime:
    """Owns the llama_model, the llama_context and the log bridge; frees them on close()."""

    # The bindings are reached through the module object (`self._ll`), so what they return is untyped here:
    # these say what the handles are. `memory` is set by `_load`.
    _model: llama_model_p | None
    _ctx: llama_context_p | None
    _adapter: llama_adapter_lora_p | None
    memory: llama_memory_t | None
    vocab: llama_vocab_p | None

    def __init__(self, cfg: RuntimeConfig) -> None:
        self.cfg = cfg
        self.info: GGUFInfo = check_gguf(cfg.model_path)
        try:
            import llama_cpp  # optional dependency: the edge extra
        except ImportError:
            raise ModelLoadError("llama-cpp-python is not installed: pip install 'tiergate[edge]'") from None
        if cfg.check_memory:  # on a CPU-only build every layer stays in host memory, whatever was asked
            offload = cfg.n_gpu_layers if llama_cpp.llama_supports_gpu_offload() else 0
            check_memory(self.info, cfg.ctx_per_seq * cfg.parallel, gpu_layers=offload)
        self._ll = llama_cpp
        self._log = LlamaLogBridge()
        llama_cpp.llama_backend_init()
        self._model = None
        self._ctx = None
        self._adapter = None
        try:
            self._load()
        except BaseException:
            self.close()
            raise
        self.fast = GilCalls(llama_cpp)
        self.vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab: int = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.bos: int = llama_cpp.llama_vocab_bos(self.vocab)
        self.eos: int = llama_cpp.llama_vocab_eos(self.vocab)
        self.add_bos: bool = bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))
        self._pieces: list[bytes | None] = [None] * self.n_vocab
        self._eog = [bool(llama_cpp.llama_vocab_is_eog(self.vocab, t)) for t in range(self.n_vocab)]
        self._piece_buf = ctypes.create_string_buffer(256)
        tmpl = llama_cpp.llama_model_chat_template(self._model, None)
        self.chat_template: ChatTemplate | BuiltinTemplate = choose_template(
            llama_cpp,
            tmpl.decode("utf-8", errors="replace") if tmpl else None,
            self.info.architecture,
            bos_token=self._special_text(self.bos),
            eos_token=self._special_text(self.eos),
        )
        self.n_ctx_total: int = llama_cpp.llama_n_ctx(self._ctx)
        self.n_seq_max: int = llama_cpp.llama_n_seq_max(self._ctx)
        log.info(
            "model loaded",
            model=str(cfg.model_path),
            arch=self.info.architecture,
            n_vocab=self.n_vocab,
            n_ctx_total=self.n_ctx_total,
            slots=self.n_seq_max,
            kv_unified=cfg.kv_unified,
            threads=cfg.threads,
            chat_template=self.chat_template.origin,
            lora=str(self.lora_path) if self.lora_path else None,
        )

    # ------------------------------------------------------------------ loading

    def _load(self) -> None:
        ll, cfg = self._ll, self.cfg
        mparams = ll.llama_model_default_params()
        mparams.n_gpu_layers = cfg.n_gpu_layers
        self._model = ll.llama_model_load_from_file(os.fsencode(cfg.model_path), mparams)
        if not self._model:
            why = self._log.last_error() or "unsupported or damaged model"
            raise ModelLoadError(f"llama.cpp could not load {cfg.model_path}: {why}")
        cparams = ll.llama_context_default_params()
        cparams.n_ctx = cfg.ctx_per_seq * cfg.parallel
        cparams.n_batch = cfg.n_batch
        cparams.n_ubatch = cfg.n_batch
        cparams.n_seq_max = cfg.parallel
        cparams.n_threads = cfg.threads
        cparams.n_threads_batch = cfg.threads
        cparams.kv_unified = cfg.kv_unified
        cparams.no_perf = True
        self._ctx = ll.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            why = self._log.last_error() or "context creation failed"
            raise ModelLoadError(f"llama.cpp could not create a context for {cfg.model_path}: {why}")
        self.memory = ll.llama_get_memory(self._ctx)
        self.lora_path: Path | None = None
        if cfg.lora_path is not None:
            self.set_lora(cfg.lora_path)

    def set_lora(self, path: Path | None) -> None:
        """Apply the GGUF LoRA adapter at `path` (None: none) in place of the current one; on a refused adapter the
        current one stays. Engine thread only once serving: the context is the decode loop's."""
        # llama.cpp applies adapters per context, not per sequence: every slot of this node answers with it.
        ll = self._ll
        new = None
        if path is not None:
            if not path.is_file():
                raise ModelLoadError(f"LoRA adapter {path}: no such file")
            new = ll.llama_adapter_lora_init(self._model, os.fsencode(path))
            if not new:
                why = self._log.last_error() or "not a LoRA adapter GGUF for this model"
                raise ModelLoadError(f"llama.cpp could not load the LoRA adapter {path}: {why}")
        adapters = (ll.llama_adapter_lora_p_ctypes * 1)(new) if new else None
        scales = (ctypes.c_float * 1)(1.0) if new else None
        if ll.llama_set_adapters_lora(self._ctx, adapters, 1 if new else 0, scales) != 0:
            if new:
                ll.llama_adapter_lora_free(new)
            raise ModelLoadError(f"llama.cpp could not apply the LoRA adapter {path} to the context")
        if self._adapter:
            ll.llama_adapter_lora_free(self._adapter)
        self._adapter, self.lora_path = new, path

    def close(self) -> None:
        ll = self._ll if hasattr(self, "_ll") else None
        if ll is not None:
            if self._ctx:
                ll.llama_free(self._ctx)
                self._ctx = None
            if getattr(self, "_adapter", None):
                ll.llama_adapter_lora_free(self._adapter)
                self._adapter = None
            if self._model:
                ll.llama_model_free(self._model)
                self._model = None
        if hasattr(self, "_log"):
            self._log.close()

    # ------------------------------------------------------------------ accessors

    @property
    def ctx(self) -> llama_context_p | None:
        return self._ctx

    @property
    def llama(self) -> ModuleType:  # the llama_cpp module (ctypes bindings)
        return self._ll

    @property
    def model_ptr(self) -> llama_model_p | None:
        return self._model

    def last_llama_error(self) -> str | None:
        return self._log.last_error()

    # ------------------------------------------------------------------ vocabulary

    def tokenize(self, text: str, add_bos: bool, parse_special: bool = True) -> list[int]:
        """Text → token ids (thread-safe: reads only the vocabulary)."""
        ll = self._ll
        raw = text.encode("utf-8")
        cap = len(raw) + 8
        buf = (ll.llama_token * cap)()
        n = ll.llama_tokenize(self.vocab, raw, len(raw), buf, cap, add_bos, parse_special)
        if n < 0:
            cap = -n
            buf = (ll.llama_token * cap)()
            n = ll.llama_tokenize(self.vocab, raw, len(raw), buf, cap, add_bos, parse_special)
            if n < 0:
                raise ValueError("prompt could not be tokenized")
        tokens: list[int] = buf[:n]  # a slice of a ctypes c_int32 array is a list of ints
        return tokens

    def piece(self, token: int) -> bytes:
        """The bytes a generated token stands for (special tokens render as nothing). Engine thread only."""
        p = self._pieces[token]
        if p is None:
            n = self.fast.token_to_piece(self.vocab, token, self._piece_buf, 256, 0, False)
            p = self._piece_buf.raw[: max(n, 0)]
            self._pieces[token] = p
        return p

    def is_eog(self, token: int) -> bool:
        return self._eog[token]

    def _special_text(self, token: int) -> str:
        if token < 0:
            return ""
        buf = ctypes.create_string_buffer(256)
        n = self._ll.llama_token_to_piece(self.vocab, token, buf, 256, 0, True)
        return buf.raw[: max(n, 0)].decode("utf-8", errors="replace")
