"""One WordPiece encoder for everything the complexity model reads, loaded once per process.

Both featurizers (the conversation features and the multiple-choice expert's) and, for the built-in tokenizer,
the gateway's token count read the same ids, so a request is encoded once. Plain-ASCII text goes through
`AsciiWordPiece` (exact, several times faster than the library's full pipeline); anything else through
`tokenizers`.

Tested in `tests/complexity/test_choice.py`, `tests/complexity/test_features.py`,
`tests/complexity/test_wordpiece.py`.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

from tokenizers import Tokenizer

from tiergate.complexity.tokens import DEFAULT_TOKENIZER_FILE
from tiergate.complexity.wordpiece import AsciiWordPiece

__all__ = ["Encoder", "MAX_CHARS"]

MAX_CHARS = 16_000  # only this many characters of a message are analysed (its full length still counts)


class Encoder:
    """WordPiece ids of a text, plus what the featurizers need to know about the vocabulary."""

    def __init__(self, tokenizer_file: Path = DEFAULT_TOKENIZER_FILE) -> None:
        self.tokenizer_file = tokenizer_file
        raw = tokenizer_file.read_bytes()
        self.sha256 = hashlib.sha256(raw).hexdigest()
        tok = Tokenizer.from_str(raw.decode("utf-8"))
        tok.no_truncation()
        tok.no_padding()
        self._tok = tok
        self._ascii = AsciiWordPiece.from_config(json.loads(raw))
        vocab = tok.get_vocab()
        self.vocab_size = max(vocab.values()) + 1
        cont = bytearray(self.vocab_size)
        for piece, idx in vocab.items():
            if piece.startswith("##"):
                cont[idx] = 1
        self.continuation = bytes(cont)  # 1 for a "##" continuation piece: words split into several pieces
        self.unk = vocab.get("[UNK]", -1)
        # The gateway's default token counter reads this same file: then one encode serves both.
        self.builtin = tokenizer_file == DEFAULT_TOKENIZER_FILE

    @staticmethod
    @functools.cache
    def default() -> Encoder:
        """The shipped tokenizer's encoder, loaded once per process (it is immutable, so shared)."""
        return Encoder()

    def encode(self, text: str) -> list[int]:
        """Ids of `text` (no special tokens), exactly as the `tokenizers` library gives them."""
        ids = self._ascii.encode(text) if self._ascii is not None else None
        return self._tok.encode(text, add_special_tokens=False).ids if ids is None else ids
