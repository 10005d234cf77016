"""Does the policy agree with its servers? Each tier's real context size, read from its static endpoints.

vLLM and `edge-node serve` both list `max_model_len` (the context of one request: prompt plus completion) in
`/v1/models`. A tier whose `max_context` is larger than what a server serves routes prompts there that the
server refuses with `context_length_exceeded`; `tiergate policy check` says so (the gateway says it too, in its
log, whenever a pool learns a server's context: edge heartbeats and polls, vLLM model checks). Edge nodes that
register themselves are not listed in the policy: the gateway checks each one when it registers. A tier's
`api_key_env`, when set in this environment, is presented as the gateway would (vLLM guards /v1/models with it).
"""

from __future__ import annotations

import json
import os
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tiergate.policies.model import Policy

__all__ = ["ServerContext", "read_contexts"]


@dataclass(frozen=True, slots=True)
class ServerContext:
    tier: str
    endpoint: str
    max_context: int  # what the policy promises
    context: int | None  # what the server serves (None: not read)
    error: str | None = None  # why it could not be read

    @property
    def too_small(self) -> bool:
        return self.context is not None and self.context < self.max_context

    def describe(self) -> str:
        if self.error is not None:
            return (f"note: tier `{self.tier}`: could not read the context of {self.endpoint} ({self.error}); "
                    "not checked")
        if self.too_small:
            return (f"warning: tier `{self.tier}`: max_context {self.max_context} is larger than the {self.context} "
                    f"tokens {self.endpoint} serves (max_model_len in its /v1/models): prompts the policy sends "
                    "there may be refused with context_length_exceeded")
        return f"ok: tier `{self.tier}`: {self.endpoint} serves {self.context} tokens (max_context {self.max_context})"


def _served_context(base_url: str, model: str, timeout_s: float, key: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    request = urllib.request.Request(base_url.rstrip("/") + "/v1/models", headers=headers)
    with urllib.request.urlopen(request, timeout=timeout_s) as r:
        body = json.loads(r.read())
    entries = [e for e in body.get("data") or [] if isinstance(e, dict) and isinstance(e.get("max_model_len"), int)]
    if not entries:
        raise ValueError("/v1/models gives no max_model_len")
    chosen = next((e for e in entries if e.get("id") == model), entries[0])  # an edge node names its own model
    return int(chosen["max_model_len"])


def _one(tier: str, endpoint: str, model: str, max_context: int, timeout_s: float,
         key: str | None = None) -> ServerContext:
    try:
        return ServerContext(tier, endpoint, max_context, _served_context(endpoint, model, timeout_s, key))
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        return ServerContext(tier, endpoint, max_context, None, f"{type(exc).__name__}: {exc}")


def read_contexts(policy: Policy, timeout_s: float = 3.0) -> list[ServerContext]:
    """The context of every static endpoint of every tier, read in parallel (each bounded by `timeout_s`)."""
    jobs = [(name, url, t.served_model or t.model, t.max_context,
             os.environ.get(t.api_key_env) if t.api_key_env else None)
            for name, t in policy.tiers.items() for url in t.endpoints]
    if not jobs:
        return []

    def read(job: tuple[str, str, str, int, str | None]) -> ServerContext:
        tier, url, model, max_context, key = job
        return _one(tier, url, model, max_context, timeout_s, key)

    with ThreadPoolExecutor(max_workers=min(16, len(jobs))) as pool:
        return list(pool.map(read, jobs))
