"""The OpenAPI document for the gateway's HTTP surface, generated from the same msgspec structs that parse requests."""

from __future__ import annotations

from functools import lru_cache

import msgspec

from gateway.schemas import ChatRequest, CompletionRequest

__all__ = ["openapi_document"]

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["message", "type"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "code": {"type": ["string", "null"]}, "param": {"type": ["string", "null"]}}}},
}
_ANSWER = {"type": "object", "required": ["id", "object", "created", "model", "choices"], "properties": {
    "id": {"type": "string"}, "object": {"type": "string"}, "created": {"type": "integer"},
    "model": {"type": "string"}, "choices": {"type": "array", "items": {"type": "object"}},
    "usage": {"type": "object"}}}
_HEADERS = {
    "x-request-id": "Request id (echoed when the client sent one).",
    "x-tiergate-tier": "Tier that answered: edge, cloud or cache.",
    "x-tiergate-cache": "hit-exact, hit-semantic, miss or bypass.",
    "x-tiergate-rule": "Name of the policy rule that routed the request.",
    "x-tiergate-overhead-ms": "Time spent in the gateway itself, in milliseconds.",
}


def _errors(*codes: int) -> dict[str, object]:
    return {str(c): {"description": "Error in the OpenAI format.",
                     "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
            for c in codes}


def _completion_op(schema: str, summary: str) -> dict[str, object]:
    return {"post": {
        "summary": summary,
        "security": [{"bearer": []}],
        "requestBody": {"required": True,
                        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}},
        "responses": {
            "200": {"description": "A completion (JSON), or SSE chunks ending in `data: [DONE]` when `stream` is true.",
                    "headers": {h: {"schema": {"type": "string"}, "description": d} for h, d in _HEADERS.items()},
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Completion"}},
                                "text/event-stream": {"schema": {"type": "string"}}}},
            **_errors(400, 401, 404, 413, 429, 502, 503, 504),
        }}}


@lru_cache(maxsize=1)
def openapi_document() -> bytes:
    (chat, completion), components = msgspec.json.schema_components(
        (ChatRequest, CompletionRequest), ref_template="#/components/schemas/{name}")
    components.update({"Error": _ERROR, "Completion": _ANSWER})
    plain = {"200": {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}}}
    doc = {
        "openapi": "3.1.0",
        "info": {"title": "tiergate", "version": "0.1.0",
                 "description": "OpenAI-compatible gateway routing between edge (llama.cpp), cloud (vLLM) and a semantic cache."},
        "components": {"schemas": components,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "paths": {
            "/v1/chat/completions": _completion_op("ChatRequest", "Create a chat completion."),
            "/v1/completions": _completion_op("CompletionRequest", "Create a text completion."),
            "/v1/models": {"get": {"summary": "List models: `auto` and one per tier.", "security": [{"bearer": []}],
                                   "responses": {**plain, **_errors(401)}}},
            "/healthz": {"get": {"summary": "Liveness.", "responses": plain}},
            "/readyz": {"get": {"summary": "Readiness: policy loaded and a tier reachable.",
                                "responses": {**plain, "503": {"description": "Not ready."}}}},
            "/metrics": {"get": {"summary": "Prometheus metrics.",
                                 "responses": {"200": {"description": "OK",
                                                       "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
        },
    }
    assert chat and completion
    return msgspec.json.encode(doc)
