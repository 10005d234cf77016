"""Classification: the Features of a request, computed once, before the policy decides.

- Prompt tokens are counted with the tokenizer of the model family the request targets: the tier whose
  public model the client named; for `auto`, the policy's `defaults.tokenizer`, else the tokenizer of the
  tier that the catch-all rule (or `default_tier`) sends to, else the built-in BERT WordPiece tokenizer.
- Complexity comes from `complexity.model` (the shipped model, or the policy's `complexity_model`), which reads
  the whole conversation: system prompt, earlier turns and the last user message. With the built-in tokenizer
  one WordPiece pass over the messages serves both the token count and the complexity features.
- Priority is the tenant's tier, which a request may lower, never raise, with the header
  `x-tiergate-priority: low|normal|high|critical`.

Everything here is CPU work on immutable objects, safe to run in a worker thread (the gateway does).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from tiergate.complexity.model import DEFAULT_MODEL_FILE, ComplexityModel
from tiergate.complexity.tokens import TokenCounter
from tiergate.core import tracing
from tiergate.core.errors import bad_request
from tiergate.core.types import Features, Priority
from tiergate.core.wire import ChatRequest, ParsedRequest
from tiergate.policies.model import Policy

__all__ = ["PRIORITY_HEADER", "Classifier", "lowered_priority", "messages_of"]

PRIORITY_HEADER = "x-tiergate-priority"


class _Active(Protocol):
    @property
    def policy(self) -> Policy: ...


class PolicySource(Protocol):
    """Anything with the active policy at `.current.policy` (a PolicyStore)."""

    @property
    def current(self) -> _Active: ...


def lowered_priority(tenant_priority: Priority, asked: str | None) -> Priority:
    """The tenant's priority, lowered by the header value if it asks for less; ValueError if unparseable."""
    if not asked:
        return tenant_priority
    asked = asked.strip()
    return min(tenant_priority, Priority.parse(int(asked) if asked.isdigit() and int(asked) < 4 else asked))


def messages_of(req: ParsedRequest) -> list[tuple[str, str]]:
    """The request as (role, text) pairs; a text completion is one user message."""
    if isinstance(req, ChatRequest):
        return [(m.role, m.text()) for m in req.messages]
    return [("user", req.prompt_text())]


def _lower_keys(headers: Mapping[str, str]) -> Mapping[str, str]:
    if isinstance(headers, dict) and any(k != k.lower() for k in headers):
        return {k.lower(): v for k, v in headers.items()}
    return headers  # Starlette's Headers are already case-insensitive with lower-case keys


class Classifier:
    """Computes Features for requests under whatever policy the store holds right now."""

    def __init__(self, policy_store: PolicySource, complexity: ComplexityModel | None = None) -> None:
        self._store = policy_store
        self._fixed_complexity = complexity
        self._lock = threading.Lock()
        self._counters: dict[tuple[str | None, Path], TokenCounter] = {}
        # (policy, requested model) -> counter, for the policy in force: resolving the tokenizer spec walks
        # the policy's tiers and rules, which is worth doing once per policy, not once per request.
        self._by_model: tuple[Policy | None, dict[str | None, TokenCounter]] = (None, {})
        self._models: dict[Path, ComplexityModel] = {}
        self.warm_up()

    def warm_up(self) -> None:
        """Load the current policy's tokenizers and complexity model now, not on the first request."""
        policy = self._store.current.policy
        self.complexity_model(policy)
        self.counter_for(policy)
        for tier in policy.tiers.values():
            self.counter_for(policy, tier.model)

    # ------------------------------------------------------------------------------------ components

    def counter_for(self, policy: Policy, requested_model: str | None = None) -> TokenCounter:
        """The token counter for a request naming `requested_model` under `policy`."""
        memo_policy, memo = self._by_model
        if memo_policy is policy:
            counter = memo.get(requested_model)
            if counter is not None:
                return counter
        else:
            memo = {}
            self._by_model = (policy, memo)
        if len(memo) < 1024:  # requested names come from clients: bound what they can make us keep
            counter = memo[requested_model] = self._counter_for_spec(policy, requested_model)
            return counter
        return self._counter_for_spec(policy, requested_model)

    def _counter_for_spec(self, policy: Policy, requested_model: str | None) -> TokenCounter:
        spec = self._tokenizer_spec(policy, requested_model)
        key = (spec, policy.base_dir)
        counter = self._counters.get(key)
        if counter is None:
            with self._lock:
                counter = self._counters.get(key)
                if counter is None:
                    counter = self._counters[key] = TokenCounter(spec, policy.base_dir)
        return counter

    @staticmethod
    def _tokenizer_spec(policy: Policy, requested_model: str | None) -> str | None:
        tier = policy.tier_for_model(requested_model) if requested_model else None
        if tier is not None:  # the client named a tier's model: that model family's tokenizer
            return tier.tokenizer or policy.defaults.tokenizer
        if policy.defaults.tokenizer:
            return policy.defaults.tokenizer
        last = policy.effective_rules()[-1]
        if last.tier is not None and last.tier in policy.tiers:
            return policy.tiers[last.tier].tokenizer
        return None

    def complexity_model(self, policy: Policy) -> ComplexityModel:
        if self._fixed_complexity is not None:
            return self._fixed_complexity
        path = policy.resolve_path(policy.complexity_model) if policy.complexity_model else DEFAULT_MODEL_FILE
        model = self._models.get(path)
        if model is None:
            with self._lock:
                model = self._models.get(path)
                if model is None:  # models share the process's one WordPiece encoder
                    model = self._models[path] = ComplexityModel.load(path)
        return model

    # -------------------------------------------------------------------------------------- features

    def features(self, req: ParsedRequest, tenant: str, tenant_priority: Priority,
                 headers: Mapping[str, str], policy: Policy | None = None) -> Features:
        """Features of one request under `policy` (the request's own snapshot; the store's current one if None).
        An unparseable x-tiergate-priority header is a client error (400)."""
        with tracing.span("classify") as span:
            f = self._features(req, tenant, tenant_priority, headers, policy or self._store.current.policy)
            if span is not tracing.NULL:
                span.set_attributes({"tiergate.prompt_tokens": f.prompt_tokens, "tiergate.complexity": f.complexity,
                                     "tiergate.priority": f.priority.name.lower()})
            return f

    def _features(self, req: ParsedRequest, tenant: str, tenant_priority: Priority,
                  headers: Mapping[str, str], policy: Policy) -> Features:
        headers = _lower_keys(headers)
        try:
            priority = lowered_priority(tenant_priority, headers.get(PRIORITY_HEADER))
        except ValueError as exc:
            raise bad_request(f"Header {PRIORITY_HEADER}: {exc}", param=PRIORITY_HEADER) from None
        counter, model = self.counter_for(policy, req.model), self.complexity_model(policy)
        featured = model.featurize(messages_of(req))
        if counter.builtin and model.featurizer.encoder.builtin and featured.exact:
            prompt_tokens = counter.count_joined(req, featured.text_tokens)  # the features' pass counted them
        else:
            prompt_tokens = counter.count(req)
        complexity = model.parts(featured).score
        text = req.prompt_text()
        return Features(
            prompt_tokens=prompt_tokens,
            priority=priority,
            complexity=complexity,
            requested_model=req.model,
            tenant=tenant,
            text=text,
            headers=headers,
            stream=bool(req.stream),
            max_tokens=req.effective_max_tokens(),
            temperature=req.temperature,
        )

    def count_tokens(self, req: ParsedRequest, tier: str) -> int:
        """Prompt tokens as the given tier's tokenizer counts them (e.g. to check its max_context)."""
        policy = self._store.current.policy
        cfg = policy.tiers.get(tier)
        return self.counter_for(policy, cfg.model if cfg else None).count(req)
