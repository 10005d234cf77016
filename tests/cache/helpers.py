"""Small builders shared by the cache tests."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from tiergate.cache.metrics import CacheMetrics
from tiergate.cache.settings import CacheSettings
from tiergate.cache.types import CachedAnswer
from tiergate.core.types import CacheRule
from tiergate.core.wire import ChatRequest, CompletionRequest, Message

RULE = CacheRule(threshold=0.94)
# Generous timeouts: the test machine's two cores are shared, and a test about hits must not turn into a
# bypass because Redis or the embedder was descheduled for 100 ms. Timeout behaviour has its own tests.
SETTINGS = CacheSettings(redis_timeout_s=2.0, lookup_timeout_s=10.0, sweep_every_s=0.2)


def chat(text: str, *, model: str = "tiergate-edge", system: str | None = None, **params: Any) -> ChatRequest:
    params.setdefault("temperature", 0.0)
    msgs = [Message(role="system", content=system)] if system else []
    msgs.append(Message(role="user", content=text))
    return ChatRequest(model=model, messages=msgs, **params)


def completion(prompt: str | list[str], **params: Any) -> CompletionRequest:
    params.setdefault("temperature", 0.0)
    return CompletionRequest(model="tiergate-edge", prompt=prompt, **params)


def answer(text: str = "an answer", *, finish_reason: str = "stop", completion_tokens: int = 3) -> CachedAnswer:
    return CachedAnswer(kind="chat", text=text, finish_reason=finish_reason, model="tiergate-edge", tier="edge",
                        prompt_tokens=5, completion_tokens=completion_tokens)


def fresh_metrics() -> tuple[CacheMetrics, CollectorRegistry]:
    registry = CollectorRegistry()
    return CacheMetrics(registry), registry


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0

