"""How the edge node's answers look: OpenAI's chat and text completion objects, whole or as SSE chunks.

One `Answer` per request holds its id, creation time and model name, and what a text completion's
`text_offset` needs across chunks. Log-probabilities come in the two OpenAI shapes: chat's
`{"content": [{"token", "logprob", "bytes", "top_logprobs"}]}` and the legacy completions'
`{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import msgspec

from tiergate.edge_node.engine.request import Chunk
from tiergate.edge_node.server.logprobs import TokenLogprob
from tiergate.edge_node.server.structured import ToolCallOutput

__all__ = ["Answer", "sse"]

_json = msgspec.json.Encoder()


def sse(obj: Any) -> bytes:
    return b"data: " + _json.encode(obj) + b"\n\n"


def _usage(c: Chunk) -> dict[str, Any]:
    return {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
            "total_tokens": c.prompt_tokens + c.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": c.cached_tokens}}


def _text(piece: bytes) -> str:
    return piece.decode("utf-8", errors="replace")


class Answer:
    """The OpenAI objects of one answer."""

    def __init__(self, kind: str, model: str, *, text_offset: int = 0) -> None:
        self.kind = kind
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.model = model
        self._object = "chat.completion" if kind == "chat" else "text_completion"
        self._chunk_object = "chat.completion.chunk" if kind == "chat" else "text_completion"
        self._offset = text_offset  # characters before the next token, for a text completion's `text_offset`

    # ---- log-probabilities ----------------------------------------------------------------------------------------

    def logprobs(self, tokens: list[TokenLogprob] | None) -> dict[str, Any] | None:
        if tokens is None:
            return None
        if self.kind == "chat":
            return {"content": [{"token": _text(t.piece), "logprob": t.logprob, "bytes": list(t.piece),
                                 "top_logprobs": [{"token": _text(p), "logprob": lp, "bytes": list(p)}
                                                  for _, p, lp in t.top]} for t in tokens], "refusal": None}
        offsets = []
        for t in tokens:
            offsets.append(self._offset)
            self._offset += len(_text(t.piece))
        return {"tokens": [_text(t.piece) for t in tokens], "token_logprobs": [t.logprob for t in tokens],
                "top_logprobs": [{**{_text(p): lp for _, p, lp in t.top}, _text(t.piece): t.logprob} for t in tokens],
                "text_offset": offsets}

    # ---- whole answers ------------------------------------------------------------------------------------------

    def whole(self, text: str, last: Chunk, tokens: list[TokenLogprob] | None,
              tool_calls: list[ToolCallOutput] | None = None) -> bytes:
        finish: str | None = last.finish_reason  # "tool_calls" for a tool call, beyond the engine's reasons
        if self.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if tool_calls:
                message = {"role": "assistant", "content": None,
                           "tool_calls": [call.as_openai() for call in tool_calls]}
                finish = "tool_calls" if finish == "stop" else finish
            choice = {"index": 0, "message": message, "logprobs": self.logprobs(tokens), "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": self.logprobs(tokens), "finish_reason": finish}
        return _json.encode({"id": self.id, "object": self._object, "created": self.created, "model": self.model,
                             "choices": [choice], "usage": _usage(last)})

    # ---- stream chunks ------------------------------------------------------------------------------------------

    def chunk(self, text: str | None, finish: str | None, include_usage: bool, *, role: bool = False,
              tokens: list[TokenLogprob] | None = None) -> bytes:
        """One streamed choice: a chat delta (`role` opens the message) or a piece of completion text."""
        if self.kind == "chat":
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text:
                delta["content"] = text
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": self.logprobs(tokens),
                                      "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": self.logprobs(tokens), "finish_reason": finish}
        return self._chunk([choice], include_usage)

    def tool_call_chunk(self, calls: list[ToolCallOutput], include_usage: bool) -> bytes:
        """The whole calls in one delta (clients accumulate deltas; a grammar-bound call is known once complete)."""
        entries = [{"index": i, **call.as_openai()} for i, call in enumerate(calls)]
        return self._chunk([{"index": 0, "delta": {"role": "assistant", "content": None, "tool_calls": entries},
                             "logprobs": None, "finish_reason": None}], include_usage)

    def usage(self, last: Chunk) -> bytes:
        return sse({"id": self.id, "object": self._chunk_object, "created": self.created, "model": self.model,
                    "choices": [], "usage": _usage(last)})

    def _chunk(self, choices: list[dict[str, Any]], include_usage: bool) -> bytes:
        obj: dict[str, Any] = {"id": self.id, "object": self._chunk_object, "created": self.created,
                               "model": self.model, "choices": choices}
        if include_usage:
            obj["usage"] = None
        return sse(obj)
