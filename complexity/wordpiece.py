"""An exact, pure-Python WordPiece encoder for plain-ASCII text, in front of the `tokenizers` library.

Why: the gateway encodes every prompt once (token count and complexity features). `tokenizers` runs its full
pipeline for that (normaliser with Unicode tables, pre-tokeniser, model, an `Encoding` with offsets and
strings), which costs ~20 us warm and ~130 us when the core was idle a few milliseconds before, as it is
between requests at moderate load. For ASCII text a BERT tokenizer reduces to: lower-case, split at
whitespace and at ASCII punctuation, greedy longest-match WordPiece, which a regular expression and dict
lookups do in ~5 us warm and ~50 us cold (measured with `bench.overhead.inprocess --gap-ms 5`).

It is not a second tokenizer: it is built from the same `tokenizer.json`, only for configurations it
reproduces exactly (BertNormalizer lower-casing, BertPreTokenizer, WordPiece), and `encode` returns None
for any text it does not cover (non-ASCII, control characters, special-token text such as ``[MASK]``), which
then goes to the library. Tests compare it with the library on the labelled prompts and on random text.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["AsciiWordPiece"]

# BERT's punctuation in ASCII: 33-47, 58-64, 91-96, 123-126; every such character is a token of its own.
_PIECES = re.compile(r"[a-z0-9]+|[!-/:-@\[-`{-~]")
# What BertNormalizer(clean_text) drops rather than treats as a separator: leave those texts to the library.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


class AsciiWordPiece:
    """`encode(text)` gives the ids `tokenizers` would give (no special tokens), or None when it cannot tell."""

    def __init__(self, vocab: dict[str, int], unk_id: int, max_chars_per_word: int, specials: list[str]) -> None:
        self._whole = {piece: i for piece, i in vocab.items() if not piece.startswith("##")}
        self._continuation = {piece[2:]: i for piece, i in vocab.items() if piece.startswith("##")}
        self._unk = unk_id
        self._max = max_chars_per_word
        self._specials = re.compile("|".join(re.escape(s) for s in specials)) if specials else None

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> AsciiWordPiece | None:
        """Built from a parsed `tokenizer.json`; None unless the pipeline is one this class reproduces exactly."""
        norm, pre, model = config.get("normalizer") or {}, config.get("pre_tokenizer") or {}, config.get("model") or {}
        if not (norm.get("type") == "BertNormalizer" and norm.get("lowercase") and norm.get("clean_text")
                and pre.get("type") == "BertPreTokenizer" and model.get("type") == "WordPiece"
                and model.get("continuing_subword_prefix") == "##" and model.get("unk_token") in model.get("vocab", {})):
            return None
        vocab: dict[str, int] = model["vocab"]
        specials = [t["content"] for t in config.get("added_tokens") or []]
        return cls(vocab, vocab[model["unk_token"]], int(model.get("max_input_chars_per_word", 100)), specials)

    def encode(self, text: str) -> list[int] | None:
        if not text.isascii() or _CONTROL.search(text) or (self._specials and self._specials.search(text)):
            return None
        whole, ids = self._whole.get, []
        for word in _PIECES.findall(text.lower()):
            i = whole(word)
            if i is not None:  # the common case: the word is in the vocabulary
                ids.append(i)
            else:
                ids.extend(self._split(word))
        return ids

    def _split(self, word: str) -> list[int]:
        """Greedy longest-match-first, as WordPiece does; a word with any unmatched rest is one [UNK]."""
        if len(word) > self._max:
            return [self._unk]
        out, start, n = [], 0, len(word)
        while start < n:
            lookup = self._whole.get if start == 0 else self._continuation.get
            end = n
            while end > start:
                i = lookup(word[start:end])
                if i is not None:
                    break
                end -= 1
            else:
                return [self._unk]
            out.append(i)
            start = end
        return out
