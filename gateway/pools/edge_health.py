"""Whether an edge tier's nodes answer: every gateway replica polls every node's `/health` itself.

Static endpoints are polled for their model, slots and load too; registered nodes only for being alive (their
load comes with their heartbeats). A node that stops answering (hung, SIGSTOPped, its host gone) takes no new
requests (a static one after one failed poll, a registered one after `lost_after`), and after `lost_after`
failed polls in a row the requests still waiting for its answer to begin are told (`Endpoint.declare_lost`)
and retried elsewhere by dispatch. Tested in `tests/gateway/pools/test_edge.py`.
"""

from __future__ import annotations

import asyncio
import random

import aiohttp
import structlog

from tiergate.core.pool import Endpoint
from tiergate.gateway.pools.edge_registry import EdgeRegistry, check_context

__all__ = ["EdgeHealth"]

log = structlog.get_logger("edge_node.pool")


class EdgeHealth:
    """Polls the nodes of an `EdgeRegistry` and records on each endpoint whether it is up (`extra`)."""

    def __init__(self, registry: EdgeRegistry, *, poll_interval_s: float, lost_after: int) -> None:
        self.registry = registry
        self.tier = registry.tier
        self.poll_interval_s = poll_interval_s
        self._lost_after = max(1, lost_after)

    async def run(self, session: aiohttp.ClientSession) -> None:
        """Poll every node every `poll_interval_s` (±10 %) until cancelled."""
        while True:
            await asyncio.gather(*(self._poll(session, ep) for ep in list(self.registry.static.values())),
                                 *(self._probe(session, ep) for ep in list(self.registry.nodes.values())),
                                 return_exceptions=True)
            await asyncio.sleep(self.poll_interval_s * random.uniform(0.9, 1.1))

    async def _probe(self, session: aiohttp.ClientSession, ep: Endpoint) -> None:
        """Is a registered node alive? Any answer from /health says so (its load comes with its heartbeats)."""
        try:
            async with session.get(f"{ep.base_url}/health", headers=ep.headers) as r:
                await r.read()
        except Exception as e:  # noqa: BLE001 - any failure to reach the node counts against it
            self._poll_failed(ep, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
            return
        if not ep.extra.get("alive", True):
            log.info("edge node answers its health checks again", tier=self.tier, node_id=ep.id)
        ep.extra.update(alive=True, poll_failures=0)

    def _poll_failed(self, ep: Endpoint, why: str) -> None:
        """A failed poll: no new requests for a static endpoint at once, for a registered node (which also sends
        heartbeats) after `lost_after` in a row, when the requests waiting on it go elsewhere too."""
        x = ep.extra
        n = x["poll_failures"] = int(x.get("poll_failures", 0)) + 1  # type: ignore[call-overload]
        if x.get("source") == "static":
            x["up"] = False
        elif n >= self._lost_after:  # a registered node also heartbeats: one slow /health is not enough
            x["alive"] = False
        if n == 1:
            log.warning("edge endpoint unreachable", tier=self.tier, endpoint=ep.id, url=ep.base_url, reason=why)
        if n >= self._lost_after:
            if n == self._lost_after and ep.waiting:
                log.warning("edge endpoint lost: requests waiting on it go elsewhere", tier=self.tier,
                            endpoint=ep.id, waiting=len(ep.waiting), failed_polls=n)
            ep.declare_lost(f"{n} health checks failed: {why}")

    async def _poll(self, session: aiohttp.ClientSession, ep: Endpoint) -> None:
        """Learn a static node's model, slots and load from /health (or /v1/models for other servers)."""
        x = ep.extra
        try:
            async with session.get(f"{ep.base_url}/health", headers=ep.headers) as r:
                if r.status in (200, 503):
                    body = await r.json(content_type=None)
                    if isinstance(body, dict) and "slots" in body:
                        slots = max(int(body.get("slots") or 1), 1)
                        ep.slots = slots
                        ep.model = str(body.get("model") or ep.model)
                        ep.reported_load = (int(body.get("busy", 0)) + int(body.get("queued", 0))) / slots
                        check_context(ep, self.registry.max_context, body.get("ctx"))
                        x.update(up=True, draining=body.get("status") == "draining" or r.status == 503,
                                 busy=body.get("busy"), queued=body.get("queued"), ctx=body.get("ctx"),
                                 poll_failures=0)
                        return
            async with session.get(f"{ep.base_url}/v1/models", headers=ep.headers) as r:
                if r.status == 200:
                    data = (await r.json(content_type=None)).get("data") or []
                    if data:
                        ep.model = str(data[0].get("id") or ep.model)
                    x.update(up=True, draining=False, poll_failures=0)
                    return
            x.update(up=False, poll_failures=0)  # it answers, but not as a server we can use: not hung
        except Exception as e:  # noqa: BLE001 - any failure to reach the node means it is down
            self._poll_failed(ep, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
