"""Errors in the OpenAI format: `{"error": {"message", "type", "code", "param"}}`.

Every failure the client can see is an `OpenAIError`; handlers raise it and the app turns it
into a JSON response (or an SSE error event once a stream has begun). Nothing else escapes.

Tested in `tests/edge_node/server/test_structured.py`, `tests/fuzz/test_request_parsing.py`,
`tests/gateway/test_auth.py` and others.
"""

from __future__ import annotations

import math
import re

import msgspec

__all__ = [
    "OpenAIError",
    "bad_request",
    "error_type",
    "from_validation",
    "not_found",
    "rate_limited",
    "unauthorized",
    "upstream_error",
]


class OpenAIError(Exception):
    """An error that maps to one HTTP status and one OpenAI error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict[str, dict[str, str | None]]:
        return {"error": {"message": self.message, "type": self.type, "code": self.code, "param": self.param}}

    def to_json(self) -> bytes:
        return msgspec.json.encode(self.body())


def error_type(status: int) -> str:
    """The OpenAI error type an answer with this status carries: what a client (the OpenAI SDK among them) reads
    to tell its own mistake from the server's state. 401 and 403 are authentication and permission errors, 429 a
    rate limit, any 5xx a `server_error` (retry later), anything else an `invalid_request_error`."""
    if status >= 500:
        return "server_error"
    return {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}.get(
        status, "invalid_request_error")


def bad_request(message: str, *, code: str = "invalid_request", param: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, code=code, param=param)


def unauthorized(message: str) -> OpenAIError:
    return OpenAIError(401, message, type="authentication_error", code="invalid_api_key")


def not_found(message: str, *, code: str = "not_found", param: str | None = None) -> OpenAIError:
    return OpenAIError(404, message, code=code, param=param)


def rate_limited(message: str, retry_after_s: float, *, code: str = "rate_limit_exceeded") -> OpenAIError:
    return OpenAIError(
        429,
        message,
        type="rate_limit_error",
        code=code,
        headers={"retry-after": _seconds(retry_after_s)},
    )


def upstream_error(status: int, message: str, *, code: str, retry_after_s: float | None = None) -> OpenAIError:
    """502 (bad answer), 503 (nothing available) or 504 (timed out) from the tiers behind the gateway.

    A 503 that will likely clear soon (no healthy backend right now) says when to retry, as a 429 does.
    """
    headers = {"retry-after": _seconds(retry_after_s)} if retry_after_s is not None else None
    return OpenAIError(status, message, type="upstream_error", code=code, headers=headers)


def _seconds(wait_s: float) -> str:
    """A Retry-After value: whole seconds, rounded up (a client that waits exactly that long must not be early)."""
    return str(max(1, math.ceil(wait_s)))


def from_validation(exc: msgspec.ValidationError | msgspec.DecodeError) -> OpenAIError:
    """Turn a msgspec error into a 400 that names the offending field.

    msgspec messages look like "Expected `str`, got `int` - at `$.messages[0].content`".
    """
    text = str(exc)
    if isinstance(exc, msgspec.ValidationError):
        param = None
        if " - at `" in text:
            text, _, path = text.partition(" - at `")
            param = path.rstrip("`").removeprefix("$").removeprefix(".")
        missing = re.match(r"Object missing required field `([^`]+)`", text)
        if missing:  # name the missing field itself, not the object that lacks it
            param = f"{param}.{missing.group(1)}" if param else missing.group(1)
        where = f" (field `{param}`)" if param else ""
        return bad_request(f"Invalid request{where}: {text}", code="invalid_field", param=param)
    return bad_request(f"Request body is not valid JSON: {text}", code="invalid_json")
