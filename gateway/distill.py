"""Distillation capture: cloud answers the edge could learn from, recorded for the next edge student.

Only tenants that opted in (the policy's `distill.tenants`) are ever recorded; for them, a cloud answer is kept when
it answered a cascade escalation, a request whose decision put an edge tier first (the edge failed or was full), or
a request decided by one of `distill.rules`. Prompt and answer pass the redaction (patterns, then the operator's
hook) before anything is written. Records go to a capped Redis stream (`tiergate:distill`; trimmed by count and by
age) when the gateway has Redis, else to a local JSONL file kept to the same bounds. `tiergate distill export`
writes them as a chat-format training set with a manifest. Every file of records (the local JSONL, its compaction,
the exported set and manifest) holds tenants' prompts and answers, so it is written readable by its owner only
(mode 0600, `write_private`), and a file an older version left wider open is narrowed when next written.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import re
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import structlog
from redis.exceptions import RedisError

from tiergate.core.wire import ChatRequest
from tiergate.gateway.context import Outcome, RequestContext
from tiergate.gateway.metrics import GatewayMetrics
from tiergate.policies.distill_config import DistillConfig

if TYPE_CHECKING:
    from tiergate.cache.redis.conn import AnyRedis

__all__ = ["PRIVATE_MODE", "STREAM_KEY", "Distiller", "JsonlRecords", "RedisRecords", "Redactor", "write_private"]

log = structlog.get_logger("tiergate.distill")
STREAM_KEY = "tiergate:distill"
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.decode
PRIVATE_MODE = 0o600  # records files: prompts and answers, readable by the gateway's user only


def _open_private(path: Path, flags: int) -> int:
    """A descriptor on `path` created with mode 0600; an existing file open to others is narrowed to 0600."""
    fd = os.open(path, flags | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), PRIVATE_MODE)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) & 0o077:
            os.fchmod(fd, PRIVATE_MODE)
    except OSError:
        os.close(fd)
        raise
    return fd


def write_private(path: Path, data: bytes) -> None:
    """Write `data` as the whole of `path`, a file only its owner may read (mode 0600)."""
    with os.fdopen(_open_private(path, os.O_WRONLY | os.O_TRUNC), "wb") as f:
        f.write(data)


class Redactor:
    """Patterns replaced by [REDACTED], then the operator's hook (module:function, text → text)."""

    def __init__(self, patterns: list[str], hook: str | None) -> None:
        self._patterns = [re.compile(p) for p in patterns]
        self._hook: Callable[[str], str] | None = None
        if hook:
            module, _, name = hook.partition(":")
            self._hook = getattr(importlib.import_module(module), name)

    def __call__(self, text: str) -> str:
        for p in self._patterns:
            text = p.sub("[REDACTED]", text)
        return self._hook(text) if self._hook is not None else text


class RedisRecords:
    """A capped Redis stream: XADD trims to `max_records`, and entries older than `ttl_s` go (MINID)."""

    def __init__(self, redis: AnyRedis) -> None:
        self._redis = redis

    async def add(self, record: dict[str, Any], cfg: DistillConfig) -> None:
        oldest_ms = int((time.time() - cfg.ttl_s) * 1000)
        pipe = self._redis.pipeline(transaction=False)
        pipe.xadd(STREAM_KEY, {"r": _encode(record)}, maxlen=cfg.max_records, approximate=True)
        pipe.xtrim(STREAM_KEY, minid=oldest_ms, approximate=True)
        await pipe.execute()

    async def all(self) -> list[dict[str, Any]]:
        out = []
        for _, fields in await self._redis.xrange(STREAM_KEY) or []:
            if fields is not None:
                out.append(_decode(fields[b"r"]))
        return out


class JsonlRecords:
    """A local JSONL file for a gateway without Redis, compacted to the same bounds when it grows past them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lines = self._count()

    def _count(self) -> int:
        try:
            with self.path.open("rb") as f:
                return sum(1 for _ in f)
        except OSError:
            return 0

    async def add(self, record: dict[str, Any], cfg: DistillConfig) -> None:
        await asyncio.to_thread(self._append, record, cfg)

    def _append(self, record: dict[str, Any], cfg: DistillConfig) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with os.fdopen(_open_private(self.path, os.O_WRONLY | os.O_APPEND), "ab") as f:
            f.write(_encode(record) + b"\n")
        self._lines += 1
        if self._lines > cfg.max_records * 1.1 + 10:
            self._compact(cfg)

    def _compact(self, cfg: DistillConfig) -> None:
        keep = [r for r in self._read() if r.get("ts", 0) >= time.time() - cfg.ttl_s][-cfg.max_records:]
        tmp = self.path.with_suffix(".tmp")
        write_private(tmp, b"".join(_encode(r) + b"\n" for r in keep))
        tmp.replace(self.path)
        self._lines = len(keep)

    def _read(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as f:
                return [_decode(line) for line in f if line.strip()]
        except OSError:
            return []

    async def all(self) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self._read)


class Distiller:
    """Decides what to record and writes it; never in the way of an answer (failures are logged and counted)."""

    def __init__(self, metrics: GatewayMetrics, records: RedisRecords | JsonlRecords) -> None:
        self._metrics = metrics
        self.records = records
        self._redactors: dict[int, Redactor] = {}

    def wanted(self, ctx: RequestContext, outcome: Outcome, tier: str) -> bool:
        cfg = ctx.policy.distill  # the request's own policy version, not whatever a reload made current since
        if cfg is None or ctx.tenant.id not in cfg.tenants:
            return False
        tiers = ctx.policy.tiers
        if tier not in tiers or tiers[tier].kind != "cloud":
            return False
        if outcome.cascade is not None and not outcome.cascade.keep:
            return cfg.escalations
        first = ctx.decision.tier
        if cfg.fallbacks and first in tiers and tiers[first].kind == "edge":
            return True
        return ctx.decision.rule in cfg.rules

    async def offer(self, ctx: RequestContext, outcome: Outcome, tier: str, answer: str, model: str) -> None:
        """Record a complete cloud answer if the policy and the tenant want it."""
        if not self.wanted(ctx, outcome, tier):
            return
        cfg = ctx.policy.distill
        assert cfg is not None
        redact = self._redactors.get(id(cfg))
        try:
            if redact is None:
                redact = self._redactors[id(cfg)] = Redactor(cfg.redact.patterns, cfg.redact.hook)
            record = self._record(ctx, outcome, tier, answer, model, redact)
            await self.records.add(record, cfg)
            self._metrics.distill.labels("recorded").inc()
        except (RedisError, OSError, ImportError, AttributeError, ValueError) as exc:
            self._metrics.distill.labels("failed").inc()
            log.warning("distill_record_failed", request_id=ctx.request_id, error=repr(exc))

    @staticmethod
    def _record(ctx: RequestContext, outcome: Outcome, tier: str, answer: str, model: str,
                redact: Redactor) -> dict[str, Any]:
        req = ctx.req
        if isinstance(req, ChatRequest):
            prompt: dict[str, Any] = {"messages": [{"role": m.role, "content": redact(m.text())} for m in req.messages]}
        else:
            prompt = {"prompt": redact(req.prompt_text())}
        cascade = None
        if outcome.cascade is not None:
            cascade = {"kept": outcome.cascade.keep, "reason": outcome.cascade.reason,
                       **outcome.cascade.confidence.as_dict()}
        return {"ts": time.time(), "request_id": ctx.request_id, "tenant": ctx.tenant.id, "kind": req.kind,
                **prompt, "answer": redact(answer), "model": model, "tier": tier, "rule": ctx.decision.rule,
                "decision": list(ctx.decision.tiers), "cascade": cascade}

