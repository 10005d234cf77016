"""Counting prompt tokens with the tokenizer of the model family a tier serves (never characters / 4).

A tokenizer spec (a tier's `tokenizer`, or `defaults.tokenizer` in the policy) is one of:
- a path to a tokenizer.json, or to a directory holding one (relative paths resolve against the policy file);
- a Hugging Face model name such as `meta-llama/Llama-3.1-8B-Instruct`, found in the local Hugging Face cache
  only (`$HF_HOME/hub`, `~/.cache/huggingface/hub`): the gateway never downloads at run time;
- `builtin:default` (alias `builtin:minilm`): the BERT WordPiece tokenizer shipped in this package
  (`complexity/tokenizer_default.json`, the vocabulary of all-MiniLM-L6-v2 / bert-base-uncased). It is the
  documented fallback when no tokenizer is configured or the configured one cannot be found; a fallback is
  logged once and visible in `TokenCounter.spec_used`.
- `builtin:demo`: the demo models' byte-level BPE tokenizer written by `tiergate prepare`
  (`$TIERGATE_DEMO_TOKENIZER`, else `$TIERGATE_HOME/models/smollm2-135m-instruct/tokenizer.json`, written by `tiergate prepare`).

Chat requests are counted over the messages' text plus a small fixed overhead per message (role markers
and separators of a chat template) and per request (the assistant turn's opening), as OpenAI documents for
its chat format; the exact template of a backend may differ by a few tokens.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import structlog
from tokenizers import Tokenizer

from tiergate.core.paths import tiergate_home
from tiergate.core.wire import ChatRequest, ParsedRequest

__all__ = [
    "DEFAULT_TOKENIZER",
    "DEFAULT_TOKENIZER_FILE",
    "PER_MESSAGE_OVERHEAD",
    "PER_REQUEST_OVERHEAD",
    "TokenCounter",
    "TokenizerNotFound",
    "load_tokenizer",
    "resolve_tokenizer",
]

log = structlog.get_logger("tiergate.tokens")

DEFAULT_TOKENIZER = "builtin:default"
DEFAULT_TOKENIZER_FILE = Path(__file__).resolve().parent / "tokenizer_default.json"
PER_MESSAGE_OVERHEAD = 4  # role markers and separators a chat template adds around each message
PER_REQUEST_OVERHEAD = 3  # the assistant turn's opening


class TokenizerNotFound(LookupError):
    """A tokenizer spec that names nothing loadable on this machine; the message says what to do."""


def _builtin(name: str) -> Path:
    if name in ("default", "minilm"):
        return DEFAULT_TOKENIZER_FILE
    if name == "demo":
        env = os.environ.get("TIERGATE_DEMO_TOKENIZER")
        home = tiergate_home()
        p = Path(env) if env else home / "models" / "smollm2-135m-instruct" / "tokenizer.json"
        if not p.is_file():
            raise TokenizerNotFound(f"builtin:demo tokenizer not found at {p} (run `tiergate prepare`, "
                                    "or set TIERGATE_DEMO_TOKENIZER)")
        return p
    raise TokenizerNotFound(f"unknown builtin tokenizer 'builtin:{name}'; allowed: builtin:default, "
                            "builtin:minilm, builtin:demo")


def _hf_cached(name: str) -> Path | None:
    """tokenizer.json of a Hugging Face model already in the local cache, newest snapshot first."""
    roots = []
    if os.environ.get("HF_HUB_CACHE"):
        roots.append(Path(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        roots.append(Path(os.environ["HF_HOME"]) / "hub")
    roots.append(Path.home() / ".cache" / "huggingface" / "hub")
    folder = "models--" + name.replace("/", "--")
    for root in roots:
        snaps = root / folder / "snapshots"
        if snaps.is_dir():
            found = sorted(snaps.glob("*/tokenizer.json"), key=lambda p: p.stat().st_mtime, reverse=True)
            if found:
                return found[0]
    return None


def resolve_tokenizer(spec: str, base_dir: Path | None = None) -> Path:
    """The tokenizer.json a spec names; raises TokenizerNotFound saying why and what is allowed."""
    if spec.startswith("builtin:"):
        return _builtin(spec.removeprefix("builtin:"))
    path = Path(spec).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    try:
        if path.is_dir():
            path = path / "tokenizer.json"
        if path.is_file():
            return path
    except OSError as exc:  # e.g. a name longer than the file system allows
        raise TokenizerNotFound(f"tokenizer path {spec[:80]!r}…: {exc.strerror or exc}") from None
    if spec.count("/") == 1 and not spec.endswith(".json") and not spec.startswith((".", "/", "~")):
        cached = _hf_cached(spec)
        if cached is not None:
            return cached
        raise TokenizerNotFound(f"Hugging Face tokenizer {spec!r} is not in the local cache (the gateway does not "
                                "download); point `tokenizer` at a tokenizer.json file instead")
    raise TokenizerNotFound(f"tokenizer file {str(path)!r} does not exist")


def load_tokenizer(path: Path) -> Tokenizer:
    """Load a tokenizer.json for counting: no truncation, no padding, whatever the file says."""
    tok = Tokenizer.from_file(str(path))
    tok.no_truncation()
    tok.no_padding()
    return tok


class TokenCounter:
    """Counts tokens for one tokenizer spec; cheap to call from any thread (the Rust tokenizer is shared)."""

    def __init__(self, spec: str | None = None, base_dir: Path | None = None, *, fallback: bool = True) -> None:
        self.spec = spec or DEFAULT_TOKENIZER
        try:
            path = resolve_tokenizer(self.spec, base_dir)
            self.spec_used = self.spec
        except TokenizerNotFound as exc:
            if not fallback:
                raise
            log.warning("tokenizer_fallback", spec=self.spec, reason=str(exc), using=DEFAULT_TOKENIZER)
            path = DEFAULT_TOKENIZER_FILE
            self.spec_used = DEFAULT_TOKENIZER
        self.path = path
        self.tokenizer = load_tokenizer(path)
        # BERT WordPiece splits at whitespace before anything else, so the text of several messages joined by
        # newlines has exactly as many tokens as the messages counted one by one (see `count_joined`).
        self.builtin = path == DEFAULT_TOKENIZER_FILE

    def count_text(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids) if text else 0

    def count_texts(self, texts: Iterable[str]) -> list[int]:
        # One encode per text, on the calling thread: `encode_batch` would hand short chats to the tokenizers
        # thread pool, whose wake-ups cost more than the work and compete with the event loop for the core.
        return [self.count_text(t) for t in texts]

    def count_messages(self, texts: list[str]) -> int:
        """Tokens of a chat: every message's text plus the template overhead."""
        return sum(self.count_texts(texts)) + PER_MESSAGE_OVERHEAD * len(texts) + PER_REQUEST_OVERHEAD

    def count_joined(self, req: ParsedRequest, joined_tokens: int) -> int:
        """`count(req)` from the token count of `req.prompt_text()` (messages joined by newlines).

        Only exact for the built-in WordPiece tokenizer (`self.builtin`): a byte-level BPE counts the newlines."""
        if isinstance(req, ChatRequest):
            return joined_tokens + PER_MESSAGE_OVERHEAD * len(req.messages) + PER_REQUEST_OVERHEAD
        return joined_tokens

    def count(self, req: ParsedRequest) -> int:
        """Prompt tokens of a chat or completion request."""
        if isinstance(req, ChatRequest):
            return self.count_messages([m.text() for m in req.messages])
        if isinstance(req.prompt, list):
            return sum(self.count_texts(req.prompt))
        return self.count_text(req.prompt)
