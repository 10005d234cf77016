"""The ASCII WordPiece fast path must give exactly the ids of the `tokenizers` library, or decline."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from tiergate.complexity.encoder import Encoder
from tiergate.complexity.wordpiece import AsciiWordPiece

TOKENIZER_FILE = Path(__file__).resolve().parents[2] / "complexity" / "tokenizer_default.json"
DATA = Path(__file__).resolve().parents[3] / "shared" / "data"


@pytest.fixture(scope="module")
def config() -> dict:
    return json.loads(TOKENIZER_FILE.read_text())


@pytest.fixture(scope="module")
def library() -> Tokenizer:
    tok = Tokenizer.from_file(str(TOKENIZER_FILE))
    tok.no_truncation()
    tok.no_padding()
    return tok


@pytest.fixture(scope="module")
def fast(config) -> AsciiWordPiece:
    wp = AsciiWordPiece.from_config(config)
    assert wp is not None
    return wp


def _library_ids(library: Tokenizer, text: str) -> list[int]:
    return library.encode(text, add_special_tokens=False).ids


AWKWARD = [
    "",
    "   \t\n\r  ",
    "Hello, world!",
    "What's 2+2=4? (yes) [no] {maybe} <tag> a/b\\c | d~e `f` ^g_ h@i #j $k %l &m *n",
    "don't won't it's o'clock",
    "e.g. i.e. U.S.A. Ph.D. 3.14159 1,000,000 -42 +7 1e-10 0x1F",
    "antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
    "x" * 99 + " " + "y" * 100 + " " + "z" * 101 + " " + "ab" * 80,
    "qzxqzxqzx vvvvvvvvvv jjjjjjjj kkkkkqqqqq",
    "CamelCaseWords HTTPServerError iPhone XMLHttpRequest",
    "Statement 1 | A group is abelian. Statement 2 | Every ring is a field.\nA. True, True\nB. False, False",
    "....!!!???---___===+++",
    "tab\tseparated\tvalues\nnew\nlines\r\nwindows",
    "snake_case_name and kebab-case-name and dotted.name.here",
    "##hash ##tags #1 ## # ###",
    "[UNK [UN K] [SEP [PAD] is not all caps [mask]",
    "123abc abc123 a1b2c3 0000000000000000000000000",
]


@pytest.mark.parametrize("text", AWKWARD)
def test_awkward_ascii_matches_the_library(fast, library, text):
    ids = fast.encode(text)
    if ids is None:  # declined: the caller falls back to the library, which is always right
        assert "[PAD]" in text or "[UNK]" in text or "[SEP]" in text
        return
    assert ids == _library_ids(library, text)


@pytest.mark.parametrize("text", [
    "café au lait",              # non-ASCII: accents
    "数学 question",              # CJK
    "emoji 🙂 here",
    "null\x00byte",              # control characters are dropped by the normaliser, not split at
    "bell\x07 and \x1b[0m escape",
    "delete\x7fchar",
    "vertical\x0btab and form\x0cfeed",
    "the [MASK] token",          # special tokens are matched in the raw text
    "[CLS] start [SEP] end",
])
def test_declines_what_it_does_not_reproduce(fast, library, text):
    assert fast.encode(text) is None
    encoder = Encoder.default()
    assert encoder.encode(text) == _library_ids(library, text)  # ... and the encoder falls back


def test_declines_configurations_it_does_not_reproduce(config):
    cased = copy.deepcopy(config)
    cased["normalizer"]["lowercase"] = False
    other_pre = copy.deepcopy(config)
    other_pre["pre_tokenizer"] = {"type": "Whitespace"}
    bpe = copy.deepcopy(config)
    bpe["model"]["type"] = "BPE"
    prefix = copy.deepcopy(config)
    prefix["model"]["continuing_subword_prefix"] = "@@"
    for changed in (cased, other_pre, bpe, prefix, {}):
        assert AsciiWordPiece.from_config(changed) is None


_ASCII = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=127), max_size=300)
_WORDY = st.lists(st.sampled_from(["the", "un", "##", "believ", "able", "quantum", "x", "zz", "7", "42", ".", ",",
                                   "(", ")", "'", " ", "  ", "\n", "\t", "-", "Q", "tokenization", "qwxz"]),
                  max_size=60).map("".join)


@settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.one_of(_ASCII, _WORDY))
def test_random_ascii_matches_the_library_or_declines(fast, library, text):
    ids = fast.encode(text)
    if ids is not None:
        assert ids == _library_ids(library, text)


def test_random_words_of_letters_match_the_library(fast, library):
    """Unknown words exercise the greedy longest-match split and the all-or-nothing [UNK]."""
    rng = random.Random(7)
    for _ in range(300):
        words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(rng.randint(1, 24)))
                 for _ in range(rng.randint(1, 12))]
        text = " ".join(words)
        assert fast.encode(text) == _library_ids(library, text)


def _prompts(path: Path, fields: tuple[str, ...]) -> list[str]:
    out = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        out.extend(row[f] for f in fields if isinstance(row.get(f), str))
    return out


@pytest.mark.skipif(not DATA.exists(), reason="needs ../shared/data")
def test_labelled_prompts_match_the_library(fast, library):
    texts = _prompts(DATA / "routing" / "mmlu_dev.jsonl", ("prompt",))
    texts += _prompts(DATA / "cache" / "qqp_pairs_dev.jsonl", ("a", "b"))[:6000]
    covered = 0
    for text in texts:
        ids = fast.encode(text)
        if ids is not None:
            covered += 1
            assert ids == _library_ids(library, text), text[:200]
    assert covered > 0.9 * len(texts)  # the fast path must actually serve most real prompts
