"""What makes two requests "the same question": namespaces, entry ids and what is cacheable at all.

A request is split into
- a *namespace*: tenant, endpoint kind, model, the generation parameters that change the answer, and the
  conversation before the last user message (system prompt, earlier turns), all hashed;
- the *text* that is matched: the last user message (chat) or the prompt (completions).
An exact hit needs the same namespace and the same normalised text; a semantic hit needs the same namespace
and a similar text. So a paraphrase is only ever matched under an identical system prompt and history,
and never across tenants, models or sampling settings.

`max_tokens` is deliberately not part of the namespace: an answer that stopped by itself within the new
request's budget is valid for it (see `answer_fits`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import unicodedata
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from tiergate.cache.embedder import clean_text
from tiergate.core.wire import ChatRequest, CompletionRequest

if TYPE_CHECKING:
    from tiergate.cache.types import CachedAnswer
    from tiergate.core.types import CacheRule
    from tiergate.core.wire import ParsedRequest

__all__ = [
    "DEFAULT_TEMPERATURE",
    "RequestKey",
    "answer_fits",
    "effective_temperature",
    "normalize_text",
    "request_key",
    "tenant_tag",
    "uncacheable_reason",
]

# OpenAI's default when a request omits `temperature`: such a request asks for a *sampled* answer, so it
# counts as temperature 1.0 and is cached only when the rule's max_temperature allows 1.0.
DEFAULT_TEMPERATURE = 1.0

_ANSWER_PARAMS = (
    "temperature", "top_p", "top_k", "min_p", "seed", "stop", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "logit_bias", "response_format", "tools", "tool_choice", "echo", "suffix", "best_of",
)


@dataclass(frozen=True, slots=True)
class RequestKey:
    tenant: str
    tenant_tag: str  # short hash of the tenant: safe inside Redis key patterns
    namespace: str  # hex; equal namespaces may share answers
    entry_id: str  # "<tenant_tag>-<hash of namespace and text>": the exact-match key
    text: str  # normalised text to embed and guard ("" when only exact matching applies)
    semantic_ok: bool  # False when the request's shape leaves no single question to match
    max_tokens: int | None


@functools.lru_cache(maxsize=4096)
def tenant_tag(tenant: str) -> str:
    return hashlib.sha256(clean_text(tenant).encode()).hexdigest()[:16]


def normalize_text(text: object) -> str:
    """Unicode NFC, LF line ends, no trailing spaces on lines, no blank lines around.

    Case and inner spacing are kept: they can matter (code, names), and exact means exact.
    """
    t = unicodedata.normalize("NFC", clean_text(text)).replace("\r\n", "\n").replace("\r", "\n")
    return "\n".join(line.rstrip() for line in t.split("\n")).strip()


def effective_temperature(req: ParsedRequest) -> float:
    t = req.temperature
    if t is None or not math.isfinite(t):
        return DEFAULT_TEMPERATURE
    return float(t)


def uncacheable_reason(req: ParsedRequest, rule: CacheRule) -> str | None:
    """Why this request must neither be looked up nor stored, or None when it may."""
    if not rule.enabled:
        return "disabled"
    if effective_temperature(req) > rule.max_temperature:
        return "temperature"
    if req.n not in (None, 1) or getattr(req, "best_of", None) not in (None, 1):
        return "n"  # several choices: one stored answer cannot stand for them
    if req.logprobs or getattr(req, "top_logprobs", None):
        return "logprobs"  # a replay has no token log-probabilities
    if isinstance(req, CompletionRequest) and isinstance(req.prompt, list) and len(req.prompt) != 1:
        return "batch_prompt"
    return None


def answer_fits(answer: CachedAnswer, stored_max_tokens: int | None, max_tokens: int | None) -> bool:
    """A stored answer serves a request if it finished by itself within the budget, or had the same budget."""
    if stored_max_tokens == max_tokens:
        return True
    if answer.finish_reason != "stop":
        return False
    return max_tokens is None or answer.completion_tokens <= max_tokens


_canonical = msgspec.json.Encoder(order="sorted", enc_hook=str).encode


def _h(obj: Any) -> str:
    """sha256 of canonical JSON (sorted keys); text that is not valid UTF-8 takes the slower, cleaning path."""
    try:
        data = _canonical(obj)
    except (UnicodeEncodeError, msgspec.EncodeError, TypeError):
        data = clean_text(json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                                     default=str)).encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def _params(req: ParsedRequest) -> dict[str, Any]:
    out: dict[str, Any] = {"temperature": round(effective_temperature(req), 4)}
    for name in _ANSWER_PARAMS[1:]:
        v = getattr(req, name, None)
        if v is not None:
            out[name] = sorted(v) if name == "stop" and isinstance(v, list) else v
    return out


def _message(m: Any) -> list[Any]:
    out = [m.role, normalize_text(m.text()), m.name, m.tool_call_id, m.tool_calls]
    c = m.content
    if isinstance(c, list) and (media := [[p.type, p.image_url] for p in c if p.type != "text"]):
        out.append(media)  # two questions about different images are different questions
    return out


def _is_text_question(m: Any) -> bool:
    if m.role != "user":
        return False
    c = m.content
    return isinstance(c, str) or (isinstance(c, list) and all(p.type == "text" for p in c))


def request_key(req: ParsedRequest, tenant: str) -> RequestKey:
    tenant = clean_text(tenant)
    tag = tenant_tag(tenant)
    semantic_ok = True
    if isinstance(req, ChatRequest):
        msgs = req.messages
        last = msgs[-1] if msgs else None
        if last is not None and _is_text_question(last):
            context = [_message(m) for m in msgs[:-1]]
            text = normalize_text(last.text())
        else:  # ends with an assistant prefill, a tool result, an image...: exact only
            context = [_message(m) for m in msgs]
            text = ""
            semantic_ok = False
        max_tokens = req.effective_max_tokens()
    else:
        prompt = req.prompt if isinstance(req.prompt, str) else (req.prompt[0] if req.prompt else "")
        context = []
        text = normalize_text(prompt)
        max_tokens = req.max_tokens
    namespace = _h(["v1", tenant, req.kind, req.model, _params(req), context])[:32]
    entry_id = f"{tag}-{_h([namespace, text])[:24]}"
    if not text.strip():
        semantic_ok = False
    return RequestKey(tenant, tag, namespace, entry_id, text, semantic_ok, max_tokens)
