"""The OpenAI parameters the gateway checks itself, before any backend sees the request.

The structs in `core.wire` check types; these are the value rules, each a 400 or 404 naming the parameter. Several
answers (`n > 1`, a list of prompts) never get here: `gateway.fanout` splits them into single requests first,
reading the plain keys `n` and `prompt`; a body that spells them otherwise (JSON escapes) is refused here.
"""

from __future__ import annotations

import math
from collections.abc import Collection

from tiergate.core.errors import bad_request, not_found
from tiergate.core.wire import LOGIT_BIAS_MAX, MAX_TOP_LOGPROBS, ChatRequest, ParsedRequest

__all__ = ["MAX_TOP_K", "SAMPLING_RANGES", "check_params"]



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
            raise bad_request("Several prompts are served when the key is spelled plainly as `prompt`; this body "
                              "spells it otherwise.", param="prompt")
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
        raise bad_request("Several answers are served when the key is spelled plainly as `n`; this body spells it "
                          "otherwise.", param="n")
    _check_sampling(req)


# (field, low, high, low included): a value outside, or not a finite number, is a 400 before any backend sees it.
# /openapi.json documents the same ranges (gateway.openapi).
SAMPLING_RANGES = (
    ("temperature", 0.0, 2.0, True),
    ("top_p", 0.0, 1.0, False),
    ("presence_penalty", -2.0, 2.0, True),
    ("frequency_penalty", -2.0, 2.0, True),
    ("min_p", 0.0, 1.0, True),
    ("repetition_penalty", 0.0, 10.0, False),
)
MAX_TOP_K = 1 << 20


def _check_sampling(req: ParsedRequest) -> None:
    """Every sampling number finite and in its range. A value a float32 sampler turns into infinity or NaN (a
    logit bias of 1e39 is +inf there) aborts llama.cpp's grammar sampler: such a request must never reach a node."""
    for name, low, high, low_in in SAMPLING_RANGES:
        v = getattr(req, name)
        if v is not None and not (math.isfinite(v) and (low <= v if low_in else low < v) and v <= high):
            span = f"{'[' if low_in else '('}{low:g}, {high:g}]"
            raise bad_request(f"`{name}` must be a number in {span}.", param=name)
    if req.top_k is not None and not -1 <= req.top_k <= MAX_TOP_K:
        raise bad_request("`top_k` must be -1 (off), 0 (off) or a positive count.", param="top_k")
    for token, bias in (req.logit_bias or {}).items():
        if not token.isdigit() or not token.isascii():
            raise bad_request(f"`logit_bias` keys must be token ids (non-negative integers), got {token[:40]!r}.",
                              param="logit_bias")
        if not (math.isfinite(bias) and -LOGIT_BIAS_MAX <= bias <= LOGIT_BIAS_MAX):
            raise bad_request(f"`logit_bias` values must be numbers from -{LOGIT_BIAS_MAX:g} to {LOGIT_BIAS_MAX:g}; "
                              f"token {token} has {bias!r}.", param="logit_bias")
