"""The OpenAI parameters the gateway checks itself, before any backend sees the request.

The structs in `core.wire` check types; these are the value rules and what this gateway does not support
(more than one choice per request), each a 400 or 404 naming the parameter.
"""

from __future__ import annotations

from collections.abc import Collection

from core.errors import bad_request, not_found
from core.wire import ChatRequest, ParsedRequest

__all__ = ["MAX_TOP_LOGPROBS", "check_params"]

MAX_TOP_LOGPROBS = 20  # OpenAI's limit, and vLLM's default --max-logprobs


def check_params(req: ParsedRequest, models: Collection[str]) -> None:
    """Raise an OpenAIError for the first parameter this gateway cannot serve as given; `models` are the public
    model names of the policy's tiers (`auto` is always allowed)."""
    if req.model != "auto" and req.model not in models:
        known = ", ".join(["auto", *models])
        raise not_found(f"The model `{req.model}` does not exist. Available models: {known}.",
                        code="model_not_found", param="model")
    if isinstance(req, ChatRequest):
        if not req.messages:
            raise bad_request("`messages` must contain at least one message.", param="messages")
        max_field = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        if req.top_logprobs is not None:
            if not 0 <= req.top_logprobs <= MAX_TOP_LOGPROBS:
                raise bad_request(f"`top_logprobs` must be between 0 and {MAX_TOP_LOGPROBS}.", param="top_logprobs")
            if req.logprobs is not True:
                raise bad_request("`top_logprobs` needs `logprobs: true`.", param="top_logprobs")
        if req.logprobs is not None and not isinstance(req.logprobs, bool):
            raise bad_request("`logprobs` must be true or false.", param="logprobs")
    else:
        if isinstance(req.prompt, list) and len(req.prompt) != 1:
            raise bad_request("`prompt` must be a string or a list of exactly one string.", param="prompt")
        if req.best_of is not None and req.best_of != 1:
            raise bad_request("Only `best_of: 1` is supported: one sequence per request.", param="best_of")
        lp = req.logprobs
        if lp is not None and (isinstance(lp, bool) or not 0 <= lp <= MAX_TOP_LOGPROBS):
            raise bad_request(f"`logprobs` must be an integer from 0 to {MAX_TOP_LOGPROBS}.", param="logprobs")
        max_field = "max_tokens"
    mt = req.effective_max_tokens()
    if mt is not None and mt < 1:
        raise bad_request(f"`{max_field}` must be at least 1.", param=max_field)
    if req.n is not None and req.n != 1:
        raise bad_request("Only `n: 1` is supported.", param="n")
    if req.temperature is not None and not 0 <= req.temperature <= 2:
        raise bad_request("`temperature` must be between 0 and 2.", param="temperature")
    if req.top_p is not None and not 0 < req.top_p <= 1:
        raise bad_request("`top_p` must be in (0, 1].", param="top_p")
