"""What makes two requests "the same question": namespaces, entry ids and what is cacheable at all.

A request is split into
- a *namespace*: tenant, endpoint kind, model, the generation parameters that change the answer, the
  conversation before the last user message (system prompt, earlier turns), the last user message's `name`
  and the routing decision's tiers (`Route`), all hashed;
- the *text* that is matched: the last user message (chat) or the prompt (completions).
An exact hit needs the same namespace and the same normalised text; a semantic hit needs the same namespace
and a similar text. So a paraphrase is only ever matched under an identical system prompt and history,
and never across tenants, models, sampling settings or tiers.

`max_tokens` is deliberately not part of the namespace: an answer that stopped by itself within the new
request's budget is valid for it (see `answer_fits`). The budget that counts is the *effective* one, the
client's under the policy's and the tenant's caps (`Route.max_tokens`): an answer cut at a cap of 4 tokens was
produced under a budget of 4, whatever the client asked for.
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
    from tiergate.core.types import CacheRule, Decision
    from tiergate.core.wire import ParsedRequest

__all__ = [
    "DEFAULT_TEMPERATURE",
    "RequestKey",
    "Route",
    "answer_fits",
    "asks_logprobs",
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


# Part of every namespace: raised when what a key covers changes, so that entries stored under the old keys are never
# served again (v2: the routing decision, the effective budget and the last user message's name; entries of v1 were
# stored with the client's budget even when a cap cut them, and no longer match anything).
_KEY_VERSION = "v2"


@dataclass(frozen=True, slots=True)
class Route:
    """The routing decision an answer is produced under: part of the key, because it changes the answer.

    - `tiers`: the decision's tier and, for a cascade rule, the tier it escalates to: the tiers whose answer
      stands for this decision. They are hashed into the namespace, so an answer the edge gave one request is
      never served (exactly or semantically) to a request the policy sends to the cloud, nor the reverse; and
      `SemanticCache.store` refuses an answer from any other tier (a fallback's answer stands for a tier the
      decision did not choose, and would otherwise be served to every later request routed like this one).
    - `max_tokens`: the effective budget, the client's under the policy's and the tenant's caps
      (`RequestContext.max_tokens`). An answer cut by a cap of 4 is stored with budget 4, so it is served only
      under that budget (`answer_fits`), never to a request whose rule lets it run longer.

    Keyed on the tier, not the rule's name: two rules that send a request to the same tier with the same budget
    get the same answer, so they may share it, and renaming a rule in the policy should not empty the cache.
    """

    tiers: tuple[str, ...]
    max_tokens: int | None

    @classmethod
    def of(cls, decision: Decision, max_tokens: int | None) -> Route:
        escalation = (decision.cascade.escalate_to,) if decision.cascade is not None else ()
        return cls((decision.tier or "", *escalation), max_tokens)


@dataclass(frozen=True, slots=True)
class RequestKey:
    tenant: str
    tenant_tag: str  # short hash of the tenant: safe inside Redis key patterns
    namespace: str  # hex; equal namespaces may share answers
    entry_id: str  # "<tenant_tag>-<hash of namespace and text>": the exact-match key
    text: str  # normalised text to embed and guard ("" when only exact matching applies)
    semantic_ok: bool  # False when the request's shape leaves no single question to match
    max_tokens: int | None  # the budget the answer is produced under (the effective one when routed)
    tiers: tuple[str, ...] | None = None  # the tiers whose answers may be stored under it; None: not routed


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
    if asks_logprobs(req):
        return "logprobs"  # a replay has no token log-probabilities
    if isinstance(req, CompletionRequest) and isinstance(req.prompt, list) and len(req.prompt) != 1:
        return "batch_prompt"
    return None


def asks_logprobs(req: ParsedRequest) -> bool:
    """Whether the request wants token log-probabilities in any form: chat `logprobs: true` or any
    `top_logprobs`, completions' `logprobs: N` for any N, 0 included (0 still returns the chosen tokens'
    log-probabilities, which a stored answer does not have)."""
    lp = req.logprobs
    return (lp is not None and lp is not False) or getattr(req, "top_logprobs", None) is not None


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


def request_key(req: ParsedRequest, tenant: str, route: Route | None = None) -> RequestKey:
    """The key of `req` for `tenant`; `route` is the policy's decision for it (the gateway always gives one;
    without it, as in `tiergate cache` tools and benchmarks, the key covers the request alone)."""
    tenant = clean_text(tenant)
    tag = tenant_tag(tenant)
    semantic_ok = True
    if isinstance(req, ChatRequest):
        msgs = req.messages
        last = msgs[-1] if msgs else None
        if last is not None and _is_text_question(last):
            context = [_message(m) for m in msgs[:-1]]
            text = normalize_text(last.text())
            asker = last.name  # "What is my name?" from `alice` is not the same question from `bob`
        else:  # ends with an assistant prefill, a tool result, an image...: exact only
            context = [_message(m) for m in msgs]
            text = ""
            semantic_ok = False
            asker = None  # every message, names included, is in `context`
    else:
        prompt = req.prompt if isinstance(req.prompt, str) else (req.prompt[0] if req.prompt else "")
        context = []
        text = normalize_text(prompt)
        asker = None
    max_tokens = req.effective_max_tokens() if route is None else route.max_tokens
    tiers = None if route is None else list(route.tiers)
    namespace = _h([_KEY_VERSION, tenant, req.kind, req.model, _params(req), context, asker, tiers])[:32]
    entry_id = f"{tag}-{_h([namespace, text])[:24]}"
    if not text.strip():
        semantic_ok = False
    return RequestKey(tenant, tag, namespace, entry_id, text, semantic_ok, max_tokens,
                      None if route is None else route.tiers)
