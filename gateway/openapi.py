"""The OpenAPI 3.1 document of the gateway's whole HTTP surface, served at `/openapi.json`.

Request bodies are generated from the msgspec structs that decode them (core/wire.py, gateway/pools/edge.py), so
the types cannot drift from the parser. `_LIMITS` adds what the handlers refuse beyond the types
(`Gateway._validate`, `parse_heartbeat`): a body the document allows is one the gateway accepts, and the reverse.
tests/gateway/test_openapi.py checks both sides of every limit against a live gateway; tests/fuzz fuzzes the rest.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import msgspec

from tiergate.core.edge_identity import CLAIM_HEADER, CLAIM_PATTERN, NODE_ID_PATTERN
from tiergate.core.wire import (
    CONTROLLED_FIELDS,
    LOGIT_BIAS_MAX,
    MAX_TOP_LOGPROBS,
    ChatRequest,
    CompletionRequest,
)
from tiergate.gateway.embeddings import EmbeddingRequest
from tiergate.gateway.messages_api import MessagesRequest
from tiergate.gateway.params import MAX_TOP_K, SAMPLING_RANGES
from tiergate.gateway.pools.edge import NodeInfo
from tiergate.gateway.responses_api import ResponsesRequest

__all__ = ["openapi_document"]

Schema = dict[str, Any]

_NODE_URL = r"^https?://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(:[0-9]{1,5})?(/|/v1/?)?$"
# What `Gateway._validate` and `parse_heartbeat` refuse with 400 although the type allows it: struct -> field ->
# JSON Schema keywords for the field's value of that `type` (msgspec writes `X | None` as `anyOf: [X, null]`).
_SAMPLING: dict[str, Schema] = {
    **{name: {"type": "number", "minimum" if low_in else "exclusiveMinimum": low, "maximum": high}
       for name, low, high, low_in in SAMPLING_RANGES},
    "top_k": {"type": "integer", "minimum": -1, "maximum": MAX_TOP_K},
    "logit_bias": {"type": "object", "propertyNames": {"pattern": "^[0-9]+$"},
                   "additionalProperties": {"type": "number", "minimum": -LOGIT_BIAS_MAX, "maximum": LOGIT_BIAS_MAX}},
}
_LIMITS: dict[str, dict[str, Schema]] = {
    # The chat `max_tokens` limit is conditional: see `_chat_max_tokens`.
    "ChatRequest": {"messages": {"type": "array", "minItems": 1},
                    "max_completion_tokens": {"type": "integer", "minimum": 1}, **_SAMPLING},
    "CompletionRequest": {"prompt": {"type": "array", "minItems": 1},
                          "max_tokens": {"type": "integer", "minimum": 1}, "best_of": {"type": "integer", "const": 1},
                          **_SAMPLING},
    # slots, busy, queued and ctx carry their bounds in the struct (msgspec.Meta) and so in its schema already.
    "NodeInfo": {"node_id": {"type": "string", "pattern": f"^{NODE_ID_PATTERN.pattern}$"},
                 "url": {"type": "string", "maxLength": 2048, "pattern": _NODE_URL,
                         "description": "The node's base URL: http(s), a host and a port, no credentials, query, "
                                        "fragment or path but / or /v1. Every address its host resolves to must be "
                                        "one the gateway calls (not link-local or a metadata service; loopback only "
                                        "from this machine; within TIERGATE_EDGE_NETWORKS when set): JSON Schema "
                                        "cannot say that, so a URL this pattern allows may still be refused."}},
}
_MODEL = ("`auto` (the routing policy picks the tier) or a model `/v1/models` lists; any other name is answered "
          "404 `model_not_found`.")


def _narrow(prop: Schema, limit: Schema) -> None:
    """Add `limit` to the one branch of `prop` of the limit's type; fails loudly if the struct's type changed."""
    (branch,) = [b for b in prop.get("anyOf", [prop]) if b.get("type") == limit["type"]]
    branch.update(limit)


def _chat_max_tokens(chat: Schema) -> None:
    """`max_completion_tokens` takes precedence, so `max_tokens` is checked only when the other is absent or null."""
    chat["properties"]["max_tokens"]["description"] = "At least 1; ignored when `max_completion_tokens` is set."
    chat["if"] = {"required": ["max_completion_tokens"], "properties": {"max_completion_tokens": {"type": "integer"}}}
    chat["else"] = {"properties": {"max_tokens": {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}]}}}


def _logprobs(chat: Schema, text: Schema) -> None:
    """Chat: `logprobs` true/false, `top_logprobs` 0-20 and only with `logprobs: true`; text: `logprobs` 0-20."""
    null = {"type": "null"}
    top = f"0 to {MAX_TOP_LOGPROBS}"
    chat["properties"]["logprobs"] = {"anyOf": [{"type": "boolean"}, null],
                                      "description": "Return each token's log-probability."}
    chat["properties"]["top_logprobs"] = {"anyOf": [{"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS},
                                                    null], "description": f"Alternatives per token, {top}; needs "
                                                                         "`logprobs: true`."}
    chat.setdefault("allOf", []).append({
        "if": {"required": ["top_logprobs"], "properties": {"top_logprobs": {"type": "integer"}}},
        "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}}})
    text["properties"]["logprobs"] = {"anyOf": [{"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS}, null],
                                      "description": f"Alternatives per token, {top}."}


def _controlled(struct: Schema) -> None:
    """The unmodelled fields the gateway refuses (`CONTROLLED_FIELDS`): only null, or the value that changes nothing.

    Any other field the structs do not model is allowed (and forwarded to the backend as it is).
    """
    for name, (neutral, why) in CONTROLLED_FIELDS.items():
        if name not in struct["properties"]:
            struct["properties"][name] = {"enum": [None, *(msgspec.json.decode(v) for v in neutral)],
                                          "description": f"Refused with 400 `unsupported_parameter` unless null or "
                                                         f"the default: {why}."}


def _answers(chat: Schema, text: Schema, max_choices: int) -> None:
    """`n` and a prompt list ask for `n × prompts` answers, at most `max_choices` (TIERGATE_MAX_CHOICES)."""
    many = (f"Answers asked for: `n` × prompts is at most {max_choices} (TIERGATE_MAX_CHOICES); each is served as a "
            f"request of its own (limits, reservation, accounting), one after another.")
    for struct in (chat, text):
        _narrow(struct["properties"]["n"], {"type": "integer", "minimum": 1, "maximum": max_choices})
        struct["properties"]["n"]["description"] = many
    _narrow(text["properties"]["prompt"], {"type": "array", "maxItems": max_choices})
    text["properties"]["prompt"]["description"] = "Text, or a list of texts: one choice per prompt (`index` = " \
                                                  "prompt × n + choice). Token ids are refused."
    text.setdefault("allOf", []).extend(
        {"if": {"required": ["prompt"], "properties": {"prompt": {"type": "array", "minItems": k}}},
         "then": {"properties": {"n": {"anyOf": [{"type": "integer", "maximum": max_choices // k},
                                                 {"type": "null"}]}}}}
        for k in range(2, max_choices + 1))


def _embedding_schema(embeddings: Schema, max_inputs: int, model: str, dim: int | None) -> None:
    text = {"type": "string", "minLength": 1}
    embeddings["properties"]["input"] = {
        "anyOf": [text, {"type": "array", "items": text, "minItems": 1, "maxItems": max_inputs}],
        "description": f"A text or 1 to {max_inputs} texts (TIERGATE_EMBEDDINGS_MAX_INPUTS), each within the model's "
                       "window (`max_input_tokens` in /v1/models; a longer one is refused with 400 "
                       "`context_length_exceeded`, which JSON Schema cannot say). Token ids are refused."}
    embeddings["properties"]["encoding_format"] = {"enum": ["float", "base64"], "default": "float",
                                                   "description": "base64: little-endian float32."}
    own = {"const": dim} if dim is not None else {"minimum": 1}
    embeddings["properties"]["dimensions"] = {
        "anyOf": [{"type": "integer", **own}, {"type": "null"}],
        "description": "Omit it, or give the model's own (`dimensions` in /v1/models): the model cannot be "
                       "shortened, any other value is a 400."}
    embeddings["properties"]["model"] = {"enum": [model], "description": "TIERGATE_EMBEDDINGS_MODEL; any other name "
                                         "(and this one while the cache has no embedder) is a 404."}


def _request_schemas(max_choices: int, max_inputs: int, model: str, dim: int | None) -> dict[str, Schema]:
    _, components = msgspec.json.schema_components((ChatRequest, CompletionRequest, NodeInfo, EmbeddingRequest,
                                                    MessagesRequest, ResponsesRequest),
                                                   ref_template="#/components/schemas/{name}")
    for struct, limits in _LIMITS.items():
        for field, limit in limits.items():
            _narrow(components[struct]["properties"][field], limit)
    for struct in ("ChatRequest", "CompletionRequest"):
        components[struct]["properties"]["model"]["description"] = _MODEL
        _controlled(components[struct])
    _chat_max_tokens(components["ChatRequest"])
    _surfaces(components)
    _logprobs(components["ChatRequest"], components["CompletionRequest"])
    _answers(components["ChatRequest"], components["CompletionRequest"], max_choices)
    _embedding_schema(components["EmbeddingRequest"], max_inputs, model, dim)
    components["NodeInfo"]["description"] = ("An edge node's heartbeat: registers it (first time) or refreshes its "
                                             "load; `tier` names an edge tier, default the policy's first.")
    components["Deregistration"] = {
        "type": "object", "required": ["node_id"],
        "properties": {"node_id": {"type": "string", "pattern": f"^{NODE_ID_PATTERN.pattern}$"},
                       "tier": {"type": ["string", "null"], "description": "Edge tier; default the policy's first."}},
        "additionalProperties": {"type": ["string", "null"]},  # decoded as dict[str, str | None]
    }
    return components


_NULL: Schema = {"type": "null"}
_STATELESS = "Refused with 400: this gateway keeps no responses (send the whole conversation as `input`)."
_TEXT_PART: Schema = {"type": "object", "required": ["type"],
                      "properties": {"type": {"enum": ["input_text", "output_text", "text"]},
                                     "text": {"type": ["string", "null"]}}}
_IMAGE_PART: Schema = {"type": "object", "required": ["type", "image_url"],
                       "properties": {"type": {"const": "input_image"}, "image_url": {"type": "string"}}}
_PARTS: Schema = {"type": "array", "items": {"anyOf": [_TEXT_PART, _IMAGE_PART]}}
_CALL_ID: Schema = {"type": "string", "minLength": 1}
# What `responses_api.to_chat` checks beyond the struct's types, by the item's `type` (a message may leave it out).
_RESPONSES_ITEM: Schema = {"anyOf": [
    {"type": "object", "required": ["role"], "properties": {
        "type": {"const": "message"}, "role": {"enum": ["user", "assistant", "system", "developer"]},
        "content": {"anyOf": [{"type": "string"}, _PARTS, _NULL]}}},
    {"type": "object", "required": ["type", "call_id", "name"], "properties": {
        "type": {"const": "function_call"}, "call_id": _CALL_ID, "name": _CALL_ID,
        "arguments": {"type": ["string", "null"]}}},
    {"type": "object", "required": ["type", "call_id"], "properties": {
        "type": {"const": "function_call_output"}, "call_id": _CALL_ID,
        "output": {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}, _NULL]}}},
    {"type": "object", "required": ["type"], "properties": {"type": {"const": "reasoning"}}}],
    "description": "A message (`type` may be left out), a function call, its output, or a reasoning item (ignored)."}


def _surfaces(components: dict[str, Schema]) -> None:
    """The Messages and Responses requests as their translations check them (`gateway.surface`)."""
    messages = components["MessagesRequest"]
    messages["properties"]["model"]["description"] = _MODEL
    components["CountTokensRequest"] = {**messages, "required": [r for r in messages["required"] if r != "max_tokens"],
                                        "description": "A Messages request; `max_tokens` and `stream` are ignored."}
    resp = components["ResponsesRequest"]
    props = resp["properties"]
    props["model"]["description"] = _MODEL
    for name in ("temperature", "top_p"):
        _narrow(props[name], _SAMPLING[name])
    props["store"] = {"enum": [False, None], "description": _STATELESS}
    props["previous_response_id"] = {**_NULL, "description": _STATELESS}
    props["conversation"] = {**_NULL, "description": _STATELESS}
    props["background"] = {"enum": [False, None], "description": "Answers are given while the request is open."}
    props["reasoning"] = {"anyOf": [{"type": "object", "additionalProperties": _NULL}, _NULL],
                          "description": "Only null values: the tiers are not reasoning models."}
    props["tool_choice"] = {"anyOf": [{"enum": ["auto", "none", "required"]}, {
        "type": "object", "required": ["type", "name"],
        "properties": {"type": {"const": "function"}, "name": {"type": "string"}}}, _NULL]}
    props["input"] = {"anyOf": [{"type": "string"}, {
        "type": "array", "items": _RESPONSES_ITEM,
        "contains": {"not": {"required": ["type"], "properties": {"type": {"const": "reasoning"}}}}}]}
    components["ResponsesTool"]["properties"]["type"] = {
        "const": "function", "description": "Only function tools: built-in tools (web search, file search, ...) "
                                            "run on OpenAI's servers and are refused with 400."}
    components["ResponsesTool"]["properties"]["name"] = {"type": "string", "minLength": 1}
    components["ResponsesTool"]["required"] = ["type", "name"]
    components["ResponsesText"]["properties"]["format"] = {"anyOf": [
        {"type": "object", "required": ["type"], "properties": {"type": {"enum": ["text", "json_object"]}}},
        {"type": "object", "required": ["type", "name", "schema"],
         "properties": {"type": {"const": "json_schema"}, "name": {"type": "string", "minLength": 1},
                        "schema": {"type": "object"}, "strict": {"type": ["boolean", "null"]},
                        "description": {"type": ["string", "null"]}}}, _NULL]}


def _obj(required: list[str], **props: Schema) -> Schema:
    return {"type": "object", "required": required, "properties": props}


_STR, _INT, _BOOL = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}
_ANSWERS: dict[str, Schema] = {
    "Error": _obj(["error"], error=_obj(["message", "type", "code", "param"], message=_STR, type=_STR,
                                        code={"type": ["string", "null"]},
                                        param={"type": ["string", "null"], "description": "The offending field."})),
    "Completion": {**_obj(["id", "object", "created", "model", "choices"], id=_STR, object=_STR, created=_INT,
                          model=_STR, choices={"type": "array", "items": {"type": "object"}}, usage={"type": "object"}),
                   "description": "The backend's answer, relayed as it came (or rendered from the cache)."},
    "AnthropicError": _obj(["type", "error"], type={"const": "error"}, error=_obj(
        ["type", "message"], type=_STR, message=_STR)),
    "AnthropicMessage": {**_obj(["id", "type", "role", "model", "content", "stop_reason", "usage"], id=_STR,
                                type={"const": "message"}, role={"const": "assistant"}, model=_STR,
                                content={"type": "array", "items": {"type": "object"}},
                                stop_reason={"type": ["string", "null"]}, usage=_obj(
                                    ["input_tokens", "output_tokens"], input_tokens=_INT, output_tokens=_INT)),
                         "description": "The answer in Anthropic's shape: `text` and `tool_use` blocks."},
    "TokenCount": _obj(["input_tokens"], input_tokens=_INT),
    "Response": {**_obj(["id", "object", "created_at", "status", "model", "output"], id=_STR,
                        object={"const": "response"}, created_at=_INT, status=_STR, model=_STR,
                        output={"type": "array", "items": {"type": "object"}}, usage={"type": ["object", "null"]}),
                 "description": "The answer as a Responses API `response`: `message` and `function_call` items."},
    "Model": _obj(["id", "object", "created", "owned_by"], id=_STR, object={"const": "model"}, created=_INT,
                  owned_by=_STR),
    "ModelList": _obj(["object", "data"], object={"const": "list"}, data={"type": "array", "items": _obj(
        ["id", "object", "created", "owned_by"], id=_STR, object={"const": "model"}, created=_INT, owned_by=_STR)}),
    "EmbeddingList": _obj(["object", "data", "model", "usage"], object={"const": "list"}, model=_STR, data={
        "type": "array", "items": _obj(["object", "index", "embedding"], object={"const": "embedding"}, index=_INT,
                                       embedding={"anyOf": [{"type": "array", "items": {"type": "number"}}, _STR]})},
                          usage=_obj(["prompt_tokens", "total_tokens"], prompt_tokens=_INT, total_tokens=_INT)),
    "Readiness": _obj(["ready", "draining", "policy", "tiers"], ready=_BOOL, draining=_BOOL, policy=_STR,
                      tiers={"type": "object", "additionalProperties": _BOOL, "description": "Tier -> healthy."},
                      cache={"type": "object", "description": "The cache's store (informational: a cache that is "
                             "down is bypassed): `store` memory, redis-vectorset (Redis 8) or redis-stream "
                             "(Redis 7), `up`, and why not the one asked for (`note`, `problem`)."}),
    "CacheFeedback": {**_obj(["request_id"], request_id={"type": "string", "minLength": 1, "maxLength": 256,
                                                         "description": "The `x-request-id` of the answer."}),
                      "description": "The cache answered this request wrongly."},
    "CacheFeedbackResult": _obj(["ok", "request_id", "entry", "kind", "invalidated", "entry_threshold",
                                 "already_reported"], ok={"const": True}, request_id=_STR, entry=_STR, kind=_STR,
                                invalidated=_INT, entry_threshold={"type": ["number", "null"]},
                                already_reported=_BOOL),
    "Usage": _obj(
        ["object", "tenant", "period", "currency", "spend", "requests", "prompt_tokens", "completion_tokens",
         "budgets"], object={"const": "usage"}, tenant=_STR,
        period=_obj(["id", "start", "end"], id={**_STR, "description": "`2026-11-27`, `2026-W48` or `2026-11`"},
                    start=_STR, end={**_STR, "description": "Exclusive, UTC."}),
        currency={"type": ["string", "null"], "description": "The policy's `costs.currency` (null: no costs)."},
        spend={"type": "number", "description": "What this key spent in the period (never another key's)."},
        requests=_INT, prompt_tokens=_INT, completion_tokens=_INT,
        budgets={"type": "object", "description": "The budgets this key is under, `tenant` and `key`.",
                 "additionalProperties": _obj(
                     ["period", "period_end", "hard_limit", "soft_limit", "remaining"], period=_STR,
                     period_end=_STR, hard_limit={"type": ["number", "null"]},
                     soft_limit={"type": ["number", "null"]},
                     remaining={"type": ["number", "null"], "description": "What the hard limit leaves, "
                                "reservations of requests still running included."})}),
    "ReloadResult": _obj(["ok", "version", "error"], ok=_BOOL, version=_STR, error={"type": "null"}),
    "ReloadRejected": _obj(["ok", "version", "error"], ok=_BOOL, version=_STR,
                           error=_obj(["message", "type", "code", "param"], message=_STR, type=_STR,
                                      code={"type": ["string", "null"]}, param={"type": ["string", "null"]})),
    "DashboardData": _obj(["generated_at", "started_at", "ready", "draining", "traffic", "tiers", "policy"],
                          traffic={"type": "object"}, tiers={"type": "array"}, policy={"type": "object"}),
}
_SECURITY_SCHEMES = {
    "apiKey": {"type": "http", "scheme": "bearer", "description": "A tenant's API key."},
    "adminKey": {"type": "http", "scheme": "bearer",
                 "description": "TIERGATE_ADMIN_KEY; while it is unset, admin routes answer 403 `admin_disabled`."},
    "metricsKey": {"type": "http", "scheme": "bearer",
                   "description": "TIERGATE_METRICS_KEY; while it is unset, /metrics needs no key."},
    "edgeToken": {"type": "http", "scheme": "bearer", "description": "TIERGATE_EDGE_TOKEN, with the node's claim "
                  f"(`{CLAIM_HEADER}`): it lets a node register an id no live registration holds. While neither it "
                  "nor TIERGATE_EDGE_SECRET is set, callers on this machine (a loopback socket, no proxy headers) "
                  "need no token and any other caller gets 401."},
    "nodeKey": {"type": "http", "scheme": "bearer", "description": "The node's own key, derived from "
                "TIERGATE_EDGE_SECRET and its node id (`tiergate edge node-key ID`): the only credential that "
                "refreshes, replaces or removes a registration it did not make itself."},
    "anthropicKey": {"type": "apiKey", "in": "header", "name": "x-api-key",
                     "description": "A tenant's API key as Anthropic's clients send it (on /v1/messages)."},
    "dashboardKey": {"type": "apiKey", "in": "query", "name": "key",
                     "description": "The admin key in the URL, for a browser: `/dashboard` answers 303 with a cookie."},
    "dashboardCookie": {"type": "apiKey", "in": "cookie", "name": "tiergate_dashboard",
                        "description": "The cookie `?key=` sets (an HMAC of the admin key, not the key)."},
}
_HEADERS = {
    "x-request-id": (True, "Request id: the client's own when it sent 1 to 128 characters of letters, digits "
                            "and `._:/+=-`, else a new one."),
    "x-tiergate-tier": (True, "Tier that answered: edge, cloud or cache."),
    "x-tiergate-cache": (True, "hit-exact, hit-semantic, miss or bypass."),
    "x-tiergate-rule": (True, "Name of the policy rule that routed the request."),
    "x-tiergate-overhead-ms": (True, "Time spent in the gateway itself, in milliseconds."),
    "x-tiergate-prompt-tokens": (True, "The prompt's tokens as the routing policy counts them (its rules, the tier's "
                                       "context and the token budgets use this count); the tier's own is in `usage`."),
    "x-tiergate-fallback-from": (False, "The tier the decision named first, when a fallback tier answered."),
    "x-tiergate-cache-similarity": (False, "Cosine similarity of the cached request, on a semantic hit."),
    "x-tiergate-similarity": (False, "The same as `x-tiergate-cache-similarity` (its older name)."),
    "x-tiergate-cascade": (False, "A cascade rule's outcome: kept (the first tier's answer) or escalated."),
    "x-tiergate-cascade-reason": (False, "Why: confident, low_mean_logprob, low_token_logprob, low_margin, length, "
                                         "empty, first_tier_failed, malformed_answer or timeout."),
    "x-tiergate-answers": (False, "With `n > 1` or a list of prompts: how many answers (each a request of its own)."),
    "x-tiergate-answer-tiers": (False, "With several answers from more than one tier (or the cache): each, in order "
                                       "of first use; x-tiergate-tier is the first answer's."),
    "x-tiergate-confidence": (False, "The mean token log-probability of the first tier's answer, as judged."),
}


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(description: str, schema: Schema, **extra: Any) -> Schema:
    return {"description": description, "content": {"application/json": {"schema": schema}}, **extra}


def _error(description: str, **extra: Any) -> Schema:
    return _json(description, _ref("Error"), **extra)


_KEY_REF = {"description": "The key itself (hashed by the gateway, never logged) or its SHA-256: exactly one.",
            "oneOf": [{"type": "object", "required": ["key"], "additionalProperties": False,
                       "properties": {"key": {"type": "string", "pattern": "\\S"}}},
                      {"type": "object", "required": ["sha256"], "additionalProperties": False,
                       "properties": {"sha256": {"type": "string", "pattern": "^[0-9a-fA-F]{64}$"}}}]}


def _op(summary: str, responses: dict[str, Schema], security: list[str] | None = None, **extra: Any) -> Schema:
    """One operation; `security` lists alternative schemes, any one of which suffices ("": none, an optional key)."""
    op: Schema = {"summary": summary, **extra, "responses": responses}
    if security:
        op["security"] = [{name: []} if name else {} for name in security]
    return op


def _body(schema: Schema) -> Schema:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


_TOO_LARGE = _error("Body over TIERGATE_MAX_BODY_BYTES (`body_too_large`).")
_ADMIN_ERRORS = {"401": _error("Missing or wrong admin key."), "403": _error("TIERGATE_ADMIN_KEY is not set.")}
_EDGE_ERRORS = {"401": _error("Missing or wrong credentials: the node key of this node id, or the edge token."),
                "404": _error("No such edge tier in the active policy (`no_edge_tier`)."),
                "409": _error("Another node holds this node id (`node_id_taken`): its registration is refreshed, "
                              "replaced or removed only with its own key or claim, until it ends."),
                "413": _TOO_LARGE}
_CLAIM = [{"name": CLAIM_HEADER, "in": "header", "required": False,
           "schema": {"type": "string", "pattern": f"^{CLAIM_PATTERN.pattern}$"},
           "description": "Required unless the node presents its own key: a random value the node keeps for its "
                          "life; the registration it makes is bound to it."}]
_HTML = {"text/html": {"schema": _STR}}


def _completion(schema: str, summary: str) -> Schema:
    headers = {h: {"schema": _STR, "required": req, "description": d} for h, (req, d) in _HEADERS.items()}
    return {"post": _op(summary, security=["apiKey"], requestBody=_body(_ref(schema)), responses={
        "200": {"description": "A completion (JSON), or SSE chunks ending in `data: [DONE]` when `stream` is true.",
                "headers": headers,
                "content": {"application/json": {"schema": _ref("Completion")},
                            "text/event-stream": {"schema": _STR}}},
        "400": _error("The body does not match this schema; `param` names the field."),
        "401": _error("Missing or invalid API key."),
        "404": _error("Unknown `model` (`model_not_found`)."),
        "413": _error("Body over TIERGATE_MAX_BODY_BYTES (`body_too_large`) or prompt text over "
                      "TIERGATE_MAX_PROMPT_CHARS characters (`prompt_too_large`)."),
        "429": _error("The tenant's rate or concurrency limit, or the tier saturated past its queue time; or a "
                      "spent budget (type `insufficient_quota`, code `budget_exceeded`, `x-should-retry: false`, "
                      "Retry-After at the end of the budget's period).",
                      headers={"retry-after": {"schema": _STR, "required": True, "description": "Seconds."}}),
        "502": _error("The backends failed or answered malformed before anything was sent (`upstream_*`)."),
        "503": _error("No healthy backend in any tier the decision allows; or the spend ledger unreachable "
                      "under a hard budget with `on_redis_down: refuse` (`budget_unavailable`)."),
        "504": _error("The backends timed out (`upstream_timeout`)."),
        "4XX": _error("A policy rule's `reject` (its own status and code), or a backend's verdict on the request "
                      "relayed as it is (e.g. `context_length_exceeded`)."),
        "5XX": _error("A policy rule's `reject` with a 5xx status."),
    })}


def _surface(request: str, answer: str, error: str, summary: str, stream: str) -> Schema:
    """A surface's operation: its answer and errors documented like a completion's, in its own shapes."""
    op = _completion(request, summary)["post"]
    ok = op["responses"]["200"]
    ok["description"] = f"The answer (JSON), or {stream} when `stream` is true."
    ok["content"]["application/json"]["schema"] = _ref(answer)
    for status, doc in op["responses"].items():
        if status != "200":
            doc["content"]["application/json"]["schema"] = _ref(error)
    if error == "AnthropicError":
        op["security"] = [{"apiKey": []}, {"anthropicKey": []}]
    return {"post": op}


def _paths() -> dict[str, Schema]:
    ok = {"ok": {"const": True}}
    count = _op("Count a Messages request's prompt tokens as the routing policy does (nothing is generated).",
                security=["apiKey", "anthropicKey"], requestBody=_body(_ref("CountTokensRequest")), responses={
                    "200": _json("The count.", _ref("TokenCount")),
                    "400": _json("Not a Messages request; the message names the field.", _ref("AnthropicError")),
                    "401": _json("Missing or invalid API key.", _ref("AnthropicError")),
                    "404": _json("Unknown `model`.", _ref("AnthropicError")),
                    "413": _json("Body over TIERGATE_MAX_BODY_BYTES.", _ref("AnthropicError"))})
    return {
        "/v1/chat/completions": _completion("ChatRequest", "Create a chat completion."),
        "/v1/completions": _completion("CompletionRequest", "Create a text completion."),
        "/v1/messages": _surface("MessagesRequest", "AnthropicMessage", "AnthropicError",
                                 "Anthropic Messages, answered through the chat pipeline; errors in Anthropic's "
                                 "format. The key as `x-api-key` or a bearer token.",
                                 "Anthropic's SSE events (message_start ... message_stop)"),
        "/v1/messages/count_tokens": {"post": count},
        "/v1/responses": _surface("ResponsesRequest", "Response", "Error",
                                  "OpenAI Responses, answered through the chat pipeline. Stateless: nothing is "
                                  "stored.", "the Responses API's SSE events (response.created ... "
                                             "response.completed)"),
        "/v1/models": {"get": _op(
            "List models: `auto`, one per tier, the embedding model (while the cache has an embedder) and the "
            "policy's `model_aliases`.", security=["apiKey"], responses={
                "200": _json("The models.", _ref("ModelList")), "401": _error("Missing or invalid API key.")})},
        "/v1/models/{model_id}": {"get": _op(
            "Retrieve one model: any id `/v1/models` lists, or a name a glob alias maps.", security=["apiKey"],
            parameters=[{"name": "model_id", "in": "path", "required": True, "schema": _STR,
                         "description": "The model's id (it may contain `/`)."}],
            responses={"200": _json("The model.", _ref("Model")), "401": _error("Missing or invalid API key."),
                       "404": _error("No such model (`model_not_found`).")})},
        "/v1/embeddings": {"post": _op(
            "Create embeddings with the semantic cache's own embedder (onnxruntime, in the gateway).",
            security=["apiKey"], requestBody=_body(_ref("EmbeddingRequest")), responses={
                "200": _json("One L2-normalised vector per input, in order.", _ref("EmbeddingList"),
                             headers={"x-request-id": {"schema": _STR, "required": True, "description": "Request id."}}),
                "400": _error("The body does not match this schema (`param` names the field), a text longer than the "
                              "model's window (`context_length_exceeded`), or `dimensions` not the model's own."),
                "401": _error("Missing or invalid API key."),
                "404": _error("Not the embedding model's name, or no embedder configured (`model_not_found`)."),
                "408": _error("The body did not arrive in time (`body_timeout`)."),
                "413": _error("Body over TIERGATE_MAX_BODY_BYTES (`body_too_large`) or input over "
                              "TIERGATE_MAX_PROMPT_CHARS characters (`prompt_too_large`)."),
                "429": _error("The tenant's rate, token or concurrency limit.",
                              headers={"retry-after": {"schema": _STR, "required": True,
                                                       "description": "Seconds."}})})},
        "/v1/cache/feedback": {"post": _op(
            "Report that a cache hit's answer was wrong: its entry is invalidated and, for a semantic hit, no longer "
            "served at that similarity. Only the tenant that got the answer can report it, within a day.",
            security=["apiKey"], requestBody=_body(_ref("CacheFeedback")), responses={
                "200": _json("Applied (or reported before: `already_reported`, nothing changed).",
                             _ref("CacheFeedbackResult")),
                "400": _error("Not `{\"request_id\": \"...\"}`."),
                "401": _error("Missing or invalid API key."),
                "404": _error("No cache hit with this request id for this key (`unknown_request_id`): unknown, "
                              "expired, not a hit, or another tenant's. Nothing changed."),
                "409": _error("The cache is disabled (`cache_disabled`)."),
                "413": _TOO_LARGE,
                "503": _error("The cache store is unreachable (`cache_unavailable`).")})},
        "/v1/usage": {"get": _op(
            "The calling key's own usage in the current period (its budget's, else `period`, else the month, UTC): "
            "spend, requests, tokens, and what its budgets have left.", security=["apiKey"], parameters=[
                {"name": "period", "in": "query", "schema": {"enum": ["day", "week", "month"]},
                 "description": "The period, when the key has no budget of its own."}], responses={
                "200": _json("The key's usage.", _ref("Usage")),
                "400": _error("`period` is not day, week or month (`invalid_period`)."),
                "401": _error("Missing or invalid API key."),
                "503": _error("The spend ledger (Redis) is unreachable (`usage_unavailable`).")})},
        "/healthz": {"get": _op("Liveness.", {"200": _json("Alive.", _obj(["ok"], **ok))})},
        "/readyz": {"get": _op("Readiness: not draining, and a tier has a healthy backend.", {
            "200": _json("Ready.", _ref("Readiness")), "503": _json("Not ready.", _ref("Readiness"))})},
        "/metrics": {"get": _op(
            "Prometheus metrics (without tenant labels when TIERGATE_METRICS_TENANT_LABELS is false).",
            {"200": {"description": "The exposition format.", "content": {"text/plain": {"schema": _STR}}},
             "401": _error("TIERGATE_METRICS_KEY is set and the request does not carry it.")},
            security=["metricsKey", ""])},
        "/openapi.json": {"get": _op("This document.", {"200": _json("OpenAPI 3.1.", {"type": "object"})})},
        "/edge/v1/heartbeat": {"post": _op(
            "An edge node registers, then reports its load every ~2 s; silent for ~10 s, it is dropped.",
            security=["edgeToken", "nodeKey"], parameters=_CLAIM, requestBody=_body(_ref("NodeInfo")), responses={
                "200": _json("Registered or refreshed.", _obj(["ok", "tier"], **ok, tier=_STR)),
                "400": _error("Not a valid heartbeat (`invalid_heartbeat`, `param` names the field): a URL the "
                              "gateway will not call, a missing claim."), **_EDGE_ERRORS})},
        "/edge/v1/deregister": {"post": _op(
            "A draining edge node leaves at once.", security=["edgeToken", "nodeKey"], parameters=_CLAIM,
            requestBody=_body(_ref("Deregistration")),
            responses={"200": _json("Forgotten; `known` says whether the node was registered.",
                                    _obj(["ok", "known"], **ok, known=_BOOL)),
                       "400": _error("Not a valid deregistration (`invalid_heartbeat`)."), **_EDGE_ERRORS})},
        "/admin/policy/reload": {"post": _op("Re-read the policy file now.", security=["adminKey"], responses={
            "200": _json("Adopted, or unchanged.", _ref("ReloadResult")),
            "422": _json("Rejected (`error`, in the OpenAI shape, says why: code `policy_invalid`); the previous "
                         "policy keeps serving.", _ref("ReloadRejected")),
            **_ADMIN_ERRORS})},
        "/admin/cache/invalidate": {"post": _op(
            "Remove cache entries: one entry, a tenant's, or all. Give at least one of the three parameters.",
            security=["adminKey"], parameters=[
                {"name": "entry", "in": "query", "schema": _STR,
                 "description": "One entry (with `tenant`: only if it is that tenant's)."},
                {"name": "tenant", "in": "query", "schema": _STR, "description": "Every entry of this tenant."},
                {"name": "all", "in": "query", "schema": _STR, "description": "`true` alone: every entry."}],
            responses={"200": _json("Removed.", _obj(["ok", "removed"], **ok, removed=_INT)),
                       "400": _error("None of `entry`, `tenant`, `all=true` given."), **_ADMIN_ERRORS,
                       "409": _error("The cache is disabled (`cache_disabled`)."),
                       "503": _error("The cache store is unreachable (`cache_unavailable`).")})},
        "/admin/keys/reload": {"post": _op(
            "Re-read the tenants' key file now (it is also watched).", security=["adminKey"], responses={
                "200": _json("Adopted.", _obj(["ok", "keys", "tenants"], **ok, keys=_INT, tenants=_INT)),
                "409": _error("The keys do not come from a file (`no_key_file`)."),
                "422": _error("Rejected (`keys_invalid`, naming the file, line and field); the previous keys keep "
                              "serving."), **_ADMIN_ERRORS})},
        **{f"/admin/keys/{verb}": {"post": _op(
            f"{what} a tenant's key, on every replica within seconds (Redis).", security=["adminKey"],
            requestBody=_body(_KEY_REF), responses={
                "200": _json("Done.", _obj(["ok"], **ok)),
                "400": _error("Neither a `key` nor a 64-hex-digit `sha256`."), **_ADMIN_ERRORS})}
           for verb, what in (("revoke", "Refuse"), ("unrevoke", "Accept again"))},
        "/dashboard": {"get": _op("The live status page, for people.",
                                  security=["adminKey", "dashboardCookie", "dashboardKey"], responses={
            "200": {"description": "The page.", "content": _HTML},
            "303": {"description": "A valid `?key=`: sets the cookie and redirects to the bare URL.",
                    "headers": {"location": {"schema": _STR}, "set-cookie": {"schema": _STR}}},
            "401": {"description": "The sign-in page.", "content": _HTML},
            "403": {"description": "TIERGATE_ADMIN_KEY is not set.", "content": _HTML}})},
        "/dashboard/data": {"get": _op("What the status page shows, as JSON.",
                                       security=["adminKey", "dashboardCookie", "dashboardKey"], responses={
            "200": _json("Traffic, tiers and policy.", _ref("DashboardData")), **_ADMIN_ERRORS})},
    }


_DESCRIPTION = ("OpenAI-compatible gateway routing between edge (llama.cpp), cloud (vLLM) and a semantic cache. "
                "Errors are OpenAI-shaped: `{\"error\": {\"message\", \"type\", \"code\", \"param\"}}`. "
                "Integer fields take integers as written (`16`; `16.0` and `1.6e1` are refused), which JSON Schema's "
                "`integer` cannot say.")


@lru_cache(maxsize=8)
def openapi_document(max_choices: int = 8, max_embedding_inputs: int = 256, embeddings_model: str = "tiergate-embed",
                     embedding_dim: int | None = None) -> bytes:
    """The document for a gateway with these settings (TIERGATE_MAX_CHOICES, TIERGATE_EMBEDDINGS_MAX_INPUTS,
    TIERGATE_EMBEDDINGS_MODEL) and embedder (its dimensions; None: none loaded)."""
    schemas = _request_schemas(max_choices, max_embedding_inputs, embeddings_model, embedding_dim)
    return msgspec.json.encode({
        "openapi": "3.1.0",
        "info": {"title": "tiergate", "version": "0.1.0", "description": _DESCRIPTION},
        "components": {"schemas": {**schemas, **_ANSWERS}, "securitySchemes": _SECURITY_SCHEMES},
        "paths": _paths(),
    })
