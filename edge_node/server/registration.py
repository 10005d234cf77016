"""Announce this edge node to a gateway and keep its load reading fresh.

Every ~2 s: `POST {gateway}/edge/v1/heartbeat` with {"node_id","url","model","slots","busy","queued","ctx","tokens_per_s"}
and `Authorization: Bearer <node key>` (this node's own key, `--node-key`) or `Bearer <edge token>` (shared); the
first heartbeat registers the node. The gateway expires nodes that go silent, so heartbeats are the registration.
Every heartbeat and the deregistration also carry this process's claim (`core.edge_identity.CLAIM_HEADER`, random,
made at start): a gateway that lets the node in by the shared token (or by being on the same machine) binds the
node id to it, so no other process can refresh, replace or remove this node's registration. When the gateway is
unreachable the node keeps serving and retries with exponential backoff (capped, jittered). On drain,
`deregister()` tells the gateway to stop routing here before in-flight requests finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import secrets
import ssl
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import structlog

from tiergate.core.edge_identity import CLAIM_HEADER
from tiergate.core.tasks import cancel_and_wait
from tiergate.edge_node.engine.engine import EngineStats

__all__ = ["NodeIdentity", "Registrar"]

log = structlog.get_logger("edge_node.registration")


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    node_id: str
    url: str  # base URL the gateway should call, without /v1
    model: str


_HINTS = {
    401: "check --node-key (TIERGATE_EDGE_NODE_KEY, for this --node-id) or --token",
    403: "check --node-key (TIERGATE_EDGE_NODE_KEY, for this --node-id) or --token",
    409: "another node holds this --node-id: give each node its own id",
}


class Registrar:
    """Background heartbeat loop with backoff; `deregister()` on drain."""

    def __init__(
        self,
        gateway_url: str,
        token: str,
        identity: NodeIdentity,
        stats: Callable[[], EngineStats],
        *,
        interval_s: float = 2.0,
        max_backoff_s: float = 30.0,
        timeout_s: float = 3.0,
        tier: str | None = None,
        node_key: str | None = None,
        gateway_tls: ssl.SSLContext | None = None,
    ) -> None:
        self.gateway = gateway_url.rstrip("/")
        self.tier = tier
        self.identity = identity
        self._token = node_key or token  # the node's own key proves its id; the shared token only lets it in
        self._claim = secrets.token_urlsafe(32)
        self._tls = gateway_tls
        self._stats = stats
        self.interval = interval_s
        self.max_backoff = max_backoff_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self.registered = False
        self.failures = 0
        self.heartbeats_sent = 0

    def payload(self) -> dict[str, object]:
        s = self._stats()
        body: dict[str, object] = {
            "node_id": self.identity.node_id,
            "url": self.identity.url,
            "model": self.identity.model,
            "slots": s.slots,
            "busy": s.busy,
            "queued": s.queued,
            "ctx": s.ctx_per_slot,
            "tokens_per_s": round(s.tokens_per_s, 3),
        }
        if self.tier:
            body["tier"] = self.tier  # optional: picks the edge tier when the gateway has several
        return body

    def next_delay(self) -> float:
        """Seconds until the next attempt: the interval when healthy, exponential backoff after failures."""
        if self.failures == 0:
            return self.interval
        factor: int = 2 ** min(self.failures - 1, 16)  # failures >= 1 here: a whole power of two
        base = min(self.max_backoff, self.interval * factor)
        return base * random.uniform(0.8, 1.2)

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            headers = {CLAIM_HEADER: self._claim}
            if self._token:
                headers["Authorization"] = f"Bearer {self._token}"
            connector = aiohttp.TCPConnector(ssl=self._tls if self._tls is not None else True)
            self._session = aiohttp.ClientSession(timeout=self._timeout, headers=headers, connector=connector)
        return self._session

    async def start(self) -> None:
        if self._task is None:
            self._ensure_session()
            self._task = asyncio.create_task(self._loop(), name="edge-heartbeat")

    async def stop(self) -> None:
        await self._stop_heartbeat()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def heartbeat_once(self) -> bool:
        """One heartbeat; True when the gateway accepted it."""
        session = self._ensure_session()
        try:
            async with session.post(f"{self.gateway}/edge/v1/heartbeat", json=self.payload()) as resp:
                if resp.status < 300:
                    self.heartbeats_sent += 1
                    if not self.registered or self.failures:
                        log.info("registered with gateway", gateway=self.gateway, node_id=self.identity.node_id)
                    self.registered = True
                    self.failures = 0
                    return True
                detail = (await resp.read())[:400].decode("utf-8", errors="replace")  # any bytes, any charset
                self._failed(f"HTTP {resp.status}: {detail}", hint=_HINTS.get(resp.status))
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            self._failed(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
        return False

    def _failed(self, why: str, hint: str | None = None) -> None:
        self.failures += 1
        self.registered = False
        # Log the first failure and then every 10th, not every retry.
        if self.failures == 1 or self.failures % 10 == 0:
            log.warning(
                "gateway heartbeat failed; still serving, will retry",
                gateway=self.gateway,
                reason=why,
                failures=self.failures,
                hint=hint,
            )

    async def _loop(self) -> None:
        """Heartbeat until stopped; nothing the gateway answers (or a bug here) may end the loop for good."""
        while True:
            try:
                await self.heartbeat_once()
            except Exception as e:  # counted and logged like any failed heartbeat, then retried with backoff
                log.exception("heartbeat raised", gateway=self.gateway)
                self._failed(f"{type(e).__name__}: {e}")
            await asyncio.sleep(self.next_delay())

    async def _stop_heartbeat(self) -> None:
        with contextlib.suppress(Exception):  # a heartbeat loop that failed is stopped all the same
            await cancel_and_wait(self._task)
        self._task = None

    async def deregister(self) -> bool:
        """Stop heartbeating and ask the gateway to forget this node (bounded by the timeout)."""
        await self._stop_heartbeat()
        if self._session is None:
            return False
        try:
            async with self._session.post(
                f"{self.gateway}/edge/v1/deregister", json={"node_id": self.identity.node_id}
            ) as resp:
                ok = resp.status < 300
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            log.warning("deregistration failed; the gateway will expire this node", reason=str(e) or type(e).__name__)
            return False
        log.info("deregistered from gateway", gateway=self.gateway, ok=ok)
        self.registered = False
        return ok
