"""Outcome records: for every edge answer the gateway judged, did it stand? The learned router's training data.

A cascade judges its first tier's answer (kept, or escalated and why), an exploration judges an edge answer the
client never saw (`gateway.exploration`), and where the gateway holds the cloud's answer too, the edge's is judged
against it (`gateway.agreement`: a graded label, source `agreement`); each becomes one record: the label (1: the answer stood), the router's
features of the request as they were before the decision (`complexity.edge_router.router_features`: scores,
counts and hashed words, no text), the tenant, the rule, the edge model version that answered, the reason and the
source. The prompt itself is kept only for a tenant that opted in to distillation (the policy's
`distill.tenants`), redacted as distillation redacts it.

Records go to a capped Redis stream (`tiergate:outcomes`: trimmed by count and by age, shared by every replica,
read by `tiergate classifier train --from-outcomes`) or, without Redis, to a bounded in-process list with the same
bounds. Writing is detached from the request, and a record that cannot be written is dropped and counted: labels are
a sample, and no request waits for one.

Tested in `tests/gateway/test_learned_router.py` and `tests/integration/test_learned_router.py`.
"""

from __future__ import annotations

import asyncio
import collections
import time
from enum import StrEnum
from typing import Protocol

import msgspec
import structlog
from prometheus_client import CollectorRegistry, Counter
from redis.exceptions import RedisError

from tiergate.cache.redis.conn import AnyRedis
from tiergate.complexity.router_train import outcome_record
from tiergate.core.types import Features
from tiergate.gateway.distill import Redactor
from tiergate.policies.model import Policy
from tiergate.policies.router_config import RouterConfig

__all__ = ["MemoryOutcomes", "OutcomeRecorder", "OutcomeSource", "RedisOutcomes"]

log = structlog.get_logger("tiergate.router")
STREAM_KEY = "tiergate:outcomes"  # read by complexity.router_train (OUTCOMES_STREAM)
_encode = msgspec.json.Encoder().encode
_MAX_PENDING = 256  # records being written at once; beyond, new ones are dropped (counted)


class OutcomeSource(StrEnum):
    """Where a label came from (a metric label and a record field): a cascade's verdict, an exploration's, or
    the edge's answer judged against the cloud's (`gateway.agreement`)."""

    CASCADE = "cascade"
    EXPLORE = "explore"
    AGREEMENT = "agreement"


class Sink(Protocol):
    async def add(self, record: bytes, cfg: RouterConfig) -> None: ...


class RedisOutcomes:
    """The capped stream every replica writes to."""

    def __init__(self, redis: AnyRedis) -> None:
        self._redis = redis

    async def add(self, record: bytes, cfg: RouterConfig) -> None:
        oldest_ms = int((time.time() - cfg.ttl_s) * 1000)
        pipe = self._redis.pipeline(transaction=False)
        pipe.xadd(STREAM_KEY, {"r": record}, maxlen=cfg.max_records, approximate=True)
        pipe.xtrim(STREAM_KEY, minid=oldest_ms, approximate=True)
        await pipe.execute()


class MemoryOutcomes:
    """This process's records, for a gateway without Redis: the newest `max_records` younger than `ttl_s`."""

    def __init__(self) -> None:
        self._items: collections.deque[tuple[float, bytes]] = collections.deque()

    async def add(self, record: bytes, cfg: RouterConfig) -> None:
        now = time.time()
        self._items.append((now, record))
        while self._items and (len(self._items) > cfg.max_records or self._items[0][0] < now - cfg.ttl_s):
            self._items.popleft()

    def records(self) -> list[bytes]:
        return [r for _, r in self._items]


class OutcomeRecorder:
    """Turns judged edge answers into records and writes them, detached, to Redis or to memory."""

    def __init__(self, redis: AnyRedis | None, registry: CollectorRegistry) -> None:
        self.sink: RedisOutcomes | MemoryOutcomes = RedisOutcomes(redis) if redis is not None else MemoryOutcomes()
        self.recorded = Counter("tiergate_router_outcomes", "Edge answers judged and recorded for the learned "
                                "router, by source (cascade, explore, agreement) and whether the answer stood",
                                ["source", "stood"], registry=registry)
        self.dropped = Counter("tiergate_router_outcomes_dropped", "Outcome records not written (store unreachable "
                               "or too many being written)", registry=registry)
        self._pending: set[asyncio.Task[None]] = set()
        self._redactors: tuple[Policy | None, Redactor | None] = (None, None)

    def record(self, *, policy: Policy, features: Features, tenant: str, rule: str, edge_version: str, stood: bool,
               reason: str, source: OutcomeSource) -> None:
        """Record one label, if the policy's router records; returns at once (the write is a task)."""
        cfg = policy.router
        if cfg is None or not cfg.record:
            return
        if len(self._pending) >= _MAX_PENDING:
            self.dropped.inc()
            return
        rec = outcome_record(features, stood=stood, edge_version=edge_version, tenant=tenant, rule=rule,
                             reason=reason, source=str(source))
        if policy.distill is not None and tenant in policy.distill.tenants:  # opted in: the text, redacted
            rec["prompt"] = self._redactor(policy)(features.text)
        self.recorded.labels(source, "true" if stood else "false").inc()
        task = asyncio.get_running_loop().create_task(self._write(_encode(rec), cfg))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def _redactor(self, policy: Policy) -> Redactor:
        memo_policy, redactor = self._redactors
        if memo_policy is not policy or redactor is None:
            assert policy.distill is not None
            redactor = Redactor(policy.distill.redact.patterns, policy.distill.redact.hook)
            self._redactors = (policy, redactor)
        return redactor

    async def _write(self, record: bytes, cfg: RouterConfig) -> None:
        try:
            await self.sink.add(record, cfg)
        except (RedisError, OSError) as exc:
            self.dropped.inc()
            log.info("router_outcome_not_written", error=str(exc))

    async def flush(self) -> None:
        """Wait for the records being written (tests, shutdown)."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)
