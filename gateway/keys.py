"""The tenants' keys as they are now: the key file hot-reloaded, and revocations that reach every replica.

A leaked key must stop working without restarting the gateways. Editing the key file is seen as the policy file is
(`core.filewatch`); a file that fails validation is refused, logged and counted, and the previous keys keep
serving. An operator can also revoke a key at once (`POST /admin/keys/revoke`, by the key or its SHA-256): the
digest joins a Redis set every replica reads every `refresh_s` (and this one at once), and stays refused, whatever
the file says, until it is lifted (`POST /admin/keys/unrevoke`). Without Redis a revocation holds on the replica
that received it.

Tested in `tests/gateway/test_keys.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import structlog

from tiergate.cache.redis.conn import AnyRedis
from tiergate.core import tracing
from tiergate.core.errors import unauthorized
from tiergate.core.filewatch import poll_file, watch_file
from tiergate.core.tasks import cancel_and_wait
from tiergate.gateway.auth import KeyFileError, KeyRing, Tenant

__all__ = ["Keys"]

log = structlog.get_logger("tiergate.gateway")
_REVOKED = "tg:revoked-keys"


class Keys:
    """Bearer key → tenant, for every request; the ring swapped whole on a reload, revocations checked first."""

    def __init__(self, ring: KeyRing, *, path: Path | None = None, redis: AnyRedis | None = None,
                 refresh_s: float = 2.0, poll_interval_s: float | None = None) -> None:
        self._ring = ring
        self._path = path
        self._redis = redis
        self._refresh_s = refresh_s
        self._poll_interval_s = poll_interval_s
        self._revoked: frozenset[str] = frozenset()
        self._local_revoked: set[str] = set()  # revoked here; kept even if Redis forgot them (or is down)
        self._tasks: list[asyncio.Task[None]] = []
        self.loaded_at = time.time()
        self.last_error: str | None = None

    @property
    def ring(self) -> KeyRing:
        return self._ring

    @property
    def reloadable(self) -> bool:
        """Whether the keys come from a file (inline and demo keys cannot change while the gateway runs)."""
        return self._path is not None

    def authenticate(self, authorization: str | None) -> Tenant:
        """The tenant for `Authorization: Bearer KEY`, or a 401: missing, malformed, unknown or revoked."""
        return self.identify(authorization)[0]

    def identify(self, authorization: str | None) -> tuple[Tenant, str]:
        """The tenant and the key's SHA-256 (`authenticate`'s checks)."""
        with tracing.span("auth"):
            tenant, digest = self._ring.resolve(authorization)
            if digest in self._revoked:
                raise unauthorized("This API key has been revoked.")
            return tenant, digest

    async def reload(self) -> str | None:
        """Read the key file again; None when adopted, else why it was refused (the old keys keep serving)."""
        if self._path is None:
            return "no key file is configured (TIERGATE_API_KEYS_FILE)"
        try:
            ring = await asyncio.to_thread(KeyRing.from_file, self._path)
        except KeyFileError as exc:
            self.last_error = str(exc)
            log.error("keys_reload_rejected", error=str(exc))
            return str(exc)
        changed = ring.digests() != self._ring.digests() or ring.tenants() != self._ring.tenants()
        self._ring, self.last_error = ring, None
        if changed:
            self.loaded_at = time.time()
            log.info("keys_reloaded", keys=len(ring), tenants=len(ring.tenants()))
        return None

    async def revoke(self, digest: str) -> None:
        """Refuse the key with SHA-256 `digest` from now on, here at once and on every replica."""
        self._local_revoked.add(digest)
        self._revoked = self._revoked | {digest}
        log.warning("key_revoked", sha256_prefix=digest[:12])
        if self._redis is not None:
            async with asyncio.timeout(2.0):
                await self._redis.sadd(_REVOKED, digest)

    async def unrevoke(self, digest: str) -> None:
        self._local_revoked.discard(digest)
        self._revoked = self._revoked - {digest}
        log.info("key_unrevoked", sha256_prefix=digest[:12])
        if self._redis is not None:
            async with asyncio.timeout(2.0):
                await self._redis.srem(_REVOKED, digest)

    async def refresh(self) -> None:
        """Read every replica's revocations."""
        if self._redis is None:
            return
        async with asyncio.timeout(1.0):
            members = await self._redis.smembers(_REVOKED)
        shared = {m.decode() if isinstance(m, bytes) else str(m) for m in members}
        self._revoked = frozenset(shared | self._local_revoked)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._path is not None and not self._tasks:
            self._tasks.append(loop.create_task(watch_file(self._path, self.reload, what="keys"), name="keys-watch"))
            if self._poll_interval_s:
                self._tasks.append(loop.create_task(poll_file(self.reload, self._poll_interval_s, what="keys"),
                                                    name="keys-poll"))
        if self._redis is not None:
            with contextlib.suppress(Exception):  # Redis down at start-up: the loop below keeps trying
                await self.refresh()
            self._tasks.append(loop.create_task(self._refresh_loop(), name="keys-revocations"))

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            await cancel_and_wait(task)  # its loops never end with an error of their own

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_s)
            try:
                await self.refresh()
            except Exception as exc:  # Redis down: keep what is known
                log.debug("key_revocations_refresh_failed", error=str(exc))
