"""Prompt token counting: the configured tokenizer, chat overhead, spec resolution and documented fallback."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from tiergate.complexity.tokens import (
    DEFAULT_TOKENIZER_FILE,
    PER_MESSAGE_OVERHEAD,
    PER_REQUEST_OVERHEAD,
    TokenCounter,
    TokenizerNotFound,
    resolve_tokenizer,
)
from tiergate.core.wire import ChatRequest, CompletionRequest

TEXT = "The quick brown fox jumps over the lazy dog; naïve café, 日本語 and tokenization!"


def _bpe(path: Path) -> Path:
    """A tiny byte-level BPE tokenizer.json that counts very differently from BERT WordPiece."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(["hello world"] * 10, trainer)
    tok.save(str(path))
    return path


def test_default_counts_exactly_what_the_tokenizer_produces():
    c = TokenCounter()
    reference = Tokenizer.from_file(str(DEFAULT_TOKENIZER_FILE))
    reference.no_truncation()
    reference.no_padding()
    assert c.count_text(TEXT) == len(reference.encode(TEXT, add_special_tokens=False).ids)
    assert c.count_text("") == 0
    long = "word " * 5000  # the shipped file's 128-token truncation must not apply
    assert c.count_text(long) == 5000
    assert c.spec_used == "builtin:default"


def test_chat_adds_per_message_and_per_request_overhead():
    c = TokenCounter()
    req = msgspec.convert({"model": "auto", "messages": [{"role": "system", "content": "Be brief."},
                                                         {"role": "user", "content": TEXT}]}, ChatRequest)
    expected = c.count_text("Be brief.") + c.count_text(TEXT) + 2 * PER_MESSAGE_OVERHEAD + PER_REQUEST_OVERHEAD
    assert c.count(req) == expected


def test_completion_prompt_list_is_summed():
    c = TokenCounter()
    req = msgspec.convert({"model": "auto", "prompt": ["hello world", TEXT]}, CompletionRequest)
    assert c.count(req) == c.count_text("hello world") + c.count_text(TEXT)


def test_a_configured_tokenizer_counts_differently(tmp_path):
    path = _bpe(tmp_path / "tokenizer.json")
    bpe = TokenCounter(str(path))
    assert bpe.spec_used == str(path)
    # byte-level BPE trained on "hello world" splits unseen text into many more pieces than WordPiece
    assert bpe.count_text(TEXT) > TokenCounter().count_text(TEXT)


def test_relative_paths_and_directories_resolve_against_base_dir(tmp_path):
    (tmp_path / "tok").mkdir()
    _bpe(tmp_path / "tok" / "tokenizer.json")
    assert resolve_tokenizer("tok", tmp_path) == tmp_path / "tok" / "tokenizer.json"
    assert resolve_tokenizer("tok/tokenizer.json", tmp_path) == tmp_path / "tok" / "tokenizer.json"


def test_hugging_face_names_come_from_the_local_cache_only(tmp_path, monkeypatch):
    snap = tmp_path / "hub" / "models--acme--tiny-llm" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    _bpe(snap / "tokenizer.json")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert resolve_tokenizer("acme/tiny-llm") == snap / "tokenizer.json"
    with pytest.raises(TokenizerNotFound, match="not in the local cache"):
        resolve_tokenizer("acme/not-downloaded")


def test_builtin_demo_uses_the_env_var(tmp_path, monkeypatch):
    monkeypatch.setenv("TIERGATE_DEMO_TOKENIZER", str(_bpe(tmp_path / "demo.json")))
    assert resolve_tokenizer("builtin:demo") == tmp_path / "demo.json"
    monkeypatch.setenv("TIERGATE_DEMO_TOKENIZER", str(tmp_path / "absent.json"))
    with pytest.raises(TokenizerNotFound, match="tiergate prepare"):
        resolve_tokenizer("builtin:demo")


def test_missing_tokenizer_falls_back_to_the_documented_default(tmp_path):
    c = TokenCounter(str(tmp_path / "nope.json"))
    assert c.spec_used == "builtin:default" and c.path == DEFAULT_TOKENIZER_FILE
    assert c.count_text(TEXT) == TokenCounter().count_text(TEXT)
    with pytest.raises(TokenizerNotFound):
        TokenCounter(str(tmp_path / "nope.json"), fallback=False)
    with pytest.raises(TokenizerNotFound, match="unknown builtin"):
        resolve_tokenizer("builtin:gpt9")


def test_shipped_tokenizer_file_has_no_truncation_or_padding():
    cfg = json.loads(DEFAULT_TOKENIZER_FILE.read_text())
    assert cfg["truncation"] is None and cfg["padding"] is None


@pytest.mark.parametrize("texts", [
    ["You are terse.", "What is 2+2?"],
    ["", "naïve café, 日本語", "\x00 ctl\tchars\r\n", "x" * 120],
    ["Statement 1 | A.\nB.", "emoji 🙂👩‍💻 end"],
])
def test_joined_count_equals_the_per_message_count_for_the_builtin_tokenizer(texts):
    c = TokenCounter()
    req = msgspec.convert({"model": "m", "messages": [{"role": "user", "content": t} for t in texts]}, ChatRequest)
    joined = c.count_text(req.prompt_text())
    assert c.builtin and c.count_joined(req, joined) == c.count(req)


def test_joined_count_is_not_offered_for_other_tokenizers(tmp_path):
    assert not TokenCounter(str(_bpe(tmp_path / "bpe.json"))).builtin
