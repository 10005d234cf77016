"""A conversation → the numbers the complexity model reads: what any prompt has, not one benchmark's format.

Input is a chat (a list of (role, text) messages; a bare prompt is one user message). From one WordPiece pass
over each message (the tokenizer shipped in `complexity/tokenizer_default.json`, the gateway's default token
counter):
- lengths in tokens: the whole conversation (with the chat template's 4 tokens per message), the last user
  message, the system prompt, the earlier turns, the number of turns;
- what is asked for, in the last user message: ten families of words and phrases (code, math, proof, long
  output, constraints, reasoning, comparison, creative writing, plain lookup, specialist domain);
- structure: lines, sentences, question marks, enumerations, lettered answer options;
- surface statistics: digits, symbols, code characters and fences, LaTeX, upper case, non-ASCII, WordPiece
  fragmentation and rare pieces, word length, distinct words;
- `short`, a hinge below 8 tokens: greetings and one-line lookups ("hi", "Who is Larry Page?") gain least
  of all, which a linear term in length cannot say without also saying "longer gains more". Without it, the
  ratios of a two-letter prompt put "hi" among the most complex (added after seeing that, see
  docs/benchmarks.md).
A learned head reads only the last message's numbers (`CONTENT`); the conversation's context enters the score
through the length prior (complexity/model.py): the training data has no system prompts or earlier turns, so
nothing could learn what they mean.

Why word lookups and not one regular expression per family: an alternation with \\b and IGNORECASE costs
about 1 ms on a 2,000-character prompt; one pass over the lower-cased words with dict lookups about 0.1 ms.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tiergate.complexity.encoder import MAX_CHARS, Encoder

__all__ = ["CONTENT", "CUES", "FEATURES", "LENGTH", "OPTIONS", "Featurizer", "Featured", "Messages", "as_messages",
           "cue_counts", "last_user_text"]

Messages = Sequence[tuple[str, str]]  # (role, text)
PER_MESSAGE = 4  # tokens a chat template adds around each message (complexity/tokens.py PER_MESSAGE_OVERHEAD)
_CONTEXT_ROLES = ("system", "developer")

# "#" stands for any number; a phrase is words separated by spaces.
_CUE_PHRASES: dict[str, str] = {
    "code": "code|program|function|script|python|java|javascript|c++|sql|html|css|regex|api|class|compile|debug|"
            "bug|algorithm|implement|bash|json|def|return|import|const|var|array|string|loop|recursion|library|"
            "npm|git|docker|query|database|server|react|rust|golang",
    "math": "equation|integral|derivative|probability|solve|calculate|compute|sum|product|prime|matrix|vector|"
            "polynomial|function of|number|digit|digits|percent|ratio|average|mean|area|volume|angle|triangle|"
            "circle|square root|log|exponent|fraction|divide|multiply",
    "proof": "prove|proof|show that|derive|derivation|theorem|lemma|justify|rigorous",
    "long_output": "essay|story|article|blog|poem|song|lyrics|letter|report|speech|script|outline|plan|in detail|"
                   "detailed|comprehensive|# words|paragraph|paragraphs|chapter|chapters|page|pages|novel|"
                   "cover letter|proposal|itinerary",
    "constraints": "must|should|without|only|exactly|at least|at most|no more than|do not|don't|avoid|make sure|"
                   "ensure|format|json|table|bullet|numbered|list|limit|include|exclude|each|every|rhyme|tone|style",
    "reasoning": "why|explain|reason|reasoning|step by step|think|puzzle|riddle|logic|logical|assume|suppose|if|"
                 "then|therefore|implies|infer|deduce|how long|how many|how much|trick",
    "comparison": "compare|comparison|difference|differences|versus|vs|pros and cons|better|best|advantages|"
                  "disadvantages|tradeoff|tradeoffs|trade off|trade offs",
    "creative": "write|create|generate|compose|imagine|invent|brainstorm|design|rewrite|paraphrase|translate|"
                "summarize|summarise",
    "lookup": "what is|what are|who is|who was|when did|when was|where is|name|define|definition|meaning of|"
              "tell me about|how do i|how to|recommend|suggest",
    "domain": "legal|law|medical|medicine|diagnose|diagnosis|diagnosed|diagnostic|patient|drug|finance|financial|"
              "tax|invest|investing|investment|investments|investor|physics|chemistry|biology|quantum|economics|"
              "statistics|statistical",
}
CUES: tuple[str, ...] = tuple(_CUE_PHRASES)
_PHRASE: dict[tuple[str, ...], list[int]] = {}
for _i, _k in enumerate(CUES):
    for _ph in _CUE_PHRASES[_k].split("|"):
        _PHRASE.setdefault(tuple(_ph.split()), []).append(_i)
_FIRST = frozenset(ph[0] for ph in _PHRASE if len(ph) > 1)
_LONGEST = max(map(len, _PHRASE))
_CUE_WORD = re.compile(r"c\+\+|[a-z]+(?:'[a-z]+)?|\d+")
_ARITHMETIC = re.compile(r"\d\s*[-+*/x^]\s*\d")  # "3 + 4" counts as math

_DIGIT = re.compile(r"\d")
_SYMBOL = re.compile(r"[=+^*/<>√∑∫πθ$_{}|\\]")
_CODE_CHAR = re.compile(r"[{}();\[\]<>=#]")
_FENCE = re.compile(r"```|^(?: {4}|\t)\S", re.MULTILINE)
_LATEX = re.compile(r"\\[a-zA-Z]+|\$[^$\n]+\$")
_UPPER = re.compile(r"[A-Z]")
_NONASCII = re.compile(r"[^\x00-\x7f]")
_WORD = re.compile(r"[A-Za-z]+")
_SENTENCE = re.compile(r"[.!?](?:\s|$)")
_ENUMERATION = re.compile(r"^\s*(?:\d+[.)]|[-*•])\s", re.MULTILINE)
_OPTION = re.compile(r"^[ \t]*\(?[A-H][.)][ \t]+\S", re.MULTILINE)  # as complexity/choice.py reads options

FEATURES: tuple[str, ...] = (
    "log_tokens", "log_tokens_last", "log_tokens_system", "log_tokens_history", "log_turns",
    "log_lines", "log_sentences", "log_questions", "enumerated", "options",
    *(f"cue_{k}" for k in CUES),
    "digit_share", "symbol_share", "code_char_share", "code_fence", "latex",
    "upper_share", "nonascii_share", "fragmentation", "rare_share", "mean_word_len", "type_token_ratio",
    "short",
)
SHORT_TOKENS = 8  # `short`: how far (in log tokens) the last message falls below this many tokens
LENGTH = FEATURES.index("log_tokens")  # the length prior's input: the whole conversation
OPTIONS = FEATURES.index("options")
_CONVERSATION = ("log_tokens", "log_tokens_system", "log_tokens_history", "log_turns")
CONTENT: tuple[int, ...] = tuple(i for i, n in enumerate(FEATURES) if n not in _CONVERSATION)


def cue_counts(text: str) -> list[int]:
    """How often each CUES family occurs in `text` (whole words and phrases, case-insensitive)."""
    words = ["#" if w[0].isdigit() else w for w in _CUE_WORD.findall(text.lower())]
    counts = [0] * len(CUES)
    get = _PHRASE.get
    for j, w in enumerate(words):
        for i in get((w,), ()):
            counts[i] += 1
        if w in _FIRST:
            for n in range(2, min(_LONGEST, len(words) - j) + 1):
                for i in get(tuple(words[j:j + n]), ()):
                    counts[i] += 1
    counts[CUES.index("math")] += len(_ARITHMETIC.findall(text))
    return counts


def as_messages(item: Any) -> list[tuple[str, str]]:
    """A bare prompt, a {"prompt"} or {"messages"} record, or an OpenAI message list → (role, text) pairs."""
    if isinstance(item, str):
        return [("user", item)]
    if isinstance(item, dict):
        if "messages" in item:
            return as_messages(item["messages"])
        prompt = item.get("prompt", "")
        return [("user", prompt if isinstance(prompt, str) else "\n".join(map(str, prompt)))]
    out = []
    for m in item:
        if isinstance(m, tuple):
            out.append((str(m[0]), str(m[1])))
            continue
        c = m.get("content") or ""
        if isinstance(c, list):  # content parts: the text ones, joined as core.wire.Message.text joins them
            c = "\n".join(p["text"] for p in c if isinstance(p, dict) and p.get("text"))
        out.append((str(m.get("role", "user")), str(c)))
    return out


def _last_user(messages: Messages) -> int:
    return max((i for i, (role, _) in enumerate(messages) if role == "user"), default=len(messages) - 1)


def last_user_text(messages: Messages) -> str:
    """The text of the last user message (of the last message when there is no user message)."""
    return messages[_last_user(messages)][1] if messages else ""


@dataclass(frozen=True, slots=True)
class Featured:
    """A conversation's FEATURES, and what the gateway reuses: its tokens and the last user message."""

    values: list[float]
    text_tokens: int  # WordPiece tokens of all messages' text, no template overhead
    exact: bool  # every message had <= MAX_CHARS characters, so text_tokens counts all of it
    last_text: str
    last_ids: list[int]  # ids of last_text[:MAX_CHARS]


class Featurizer:
    """Conversation → FEATURES. Shared by training and serving, so both see identical numbers."""

    def __init__(self, encoder: Encoder | None = None) -> None:
        self.encoder = encoder or Encoder.default()

    def __call__(self, messages: Messages) -> Featured:
        enc = self.encoder
        last_i = _last_user(messages)
        n_sys = n_hist = n_last = 0
        exact = True
        last, ids = "", []
        for i, (role, text) in enumerate(messages):
            if len(text) > MAX_CHARS:
                exact = False
                text = text[:MAX_CHARS]
            if i == last_i:
                last, ids = text, enc.encode(text)
                n_last = len(ids)
            elif role in _CONTEXT_ROLES:
                n_sys += len(enc.encode(text)) if text else 0
            else:
                n_hist += len(enc.encode(text)) if text else 0
        n = len(last) + 1
        words = _WORD.findall(last)
        nw = len(words) + 1
        values = [
            math.log1p(n_last + n_sys + n_hist + PER_MESSAGE * len(messages)),
            math.log1p(n_last), math.log1p(n_sys), math.log1p(n_hist), math.log1p(len(messages)),
            math.log1p(last.count("\n")), math.log1p(len(_SENTENCE.findall(last))), math.log1p(last.count("?")),
            math.log1p(len(_ENUMERATION.findall(last))), math.log1p(len(_OPTION.findall(last))),
            # log-damped counts: "asks for code at all" matters more than how often it says so
            *(math.log1p(c) for c in cue_counts(last)),
            len(_DIGIT.findall(last)) / n, len(_SYMBOL.findall(last)) / n, len(_CODE_CHAR.findall(last)) / n,
            1.0 if _FENCE.search(last) else 0.0, math.log1p(len(_LATEX.findall(last))),
            len(_UPPER.findall(last)) / n, len(_NONASCII.findall(last)) / n,
            (sum(map(enc.continuation.__getitem__, ids)) / nw) if ids else 0.0,
            (sum(map((10_000).__lt__, ids)) / len(ids)) if ids else 0.0,
            (sum(map(len, words)) / len(words)) if words else 0.0,
            (len({w.lower() for w in words}) / nw) if words else 0.0,
            max(0.0, math.log1p(SHORT_TOKENS) - math.log1p(n_last)),
        ]
        return Featured(values, n_last + n_sys + n_hist, exact, last, ids)

    def matrix(self, conversations: Iterable[Messages]) -> np.ndarray:
        rows = [self(m).values for m in conversations]
        return np.asarray(rows, np.float64) if rows else np.zeros((0, len(FEATURES)))
