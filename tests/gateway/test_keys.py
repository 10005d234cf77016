"""`gateway.keys.Keys`: a key file edited while the gateway runs takes effect, a bad edit does not, and a revoked
key is refused at once here and, through Redis, on every replica; the admin endpoints through a gateway."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from tests.gateway.conftest import write_policy
from tests.support.inprocess import in_process
from tests.support.redis import flushed
from tests.support.waiting import eventually
from tiergate.cache.redis.conn import open_redis
from tiergate.core.errors import OpenAIError
from tiergate.gateway.auth import KeyRing, hash_key
from tiergate.gateway.keys import Keys
from tiergate.gateway.settings import Settings

pytestmark = pytest.mark.anyio
DEAD = "http://127.0.0.1:9"


def _write(path: Path, *keys: str) -> Path:
    path.write_text("tenants:\n  acme: {priority: normal}\nkeys:\n"
                    + "".join(f"  - {{tenant: acme, key: {k}}}\n" for k in keys))
    return path


def _refused(keys: Keys, key: str) -> str:
    with pytest.raises(OpenAIError) as info:
        keys.authenticate(f"Bearer {key}")
    assert info.value.status == 401
    return info.value.message


async def test_an_edited_key_file_takes_effect_without_a_restart_and_a_broken_one_does_not(tmp_path: Path):
    path = _write(tmp_path / "keys.yaml", "old-key-1")
    keys = Keys(KeyRing.from_file(path), path=path)
    await keys.start()
    try:
        assert keys.authenticate("Bearer old-key-1").id == "acme"
        def rotated() -> bool:
            """Save the rotated file (the old key out, a new one in) until the file watch has seen a save: a
            watcher starts on its own thread, and a change made before it is armed is not seen."""
            _write(path, "new-key-1")
            return keys.ring.digests() == {hash_key("new-key-1")}

        await eventually(rotated, "the edit seen by the file watch", timeout_s=30)
        assert keys.authenticate("Bearer new-key-1").id == "acme" and "Invalid" in _refused(keys, "old-key-1")
        path.write_text("tenants: [not, a, mapping]\n")  # a broken edit: refused, the last good keys serve
        assert "keys.yaml" in (await keys.reload() or "") and keys.last_error
        assert keys.authenticate("Bearer new-key-1").id == "acme"
    finally:
        await keys.stop()


async def test_a_revoked_key_is_refused_at_once_and_again_accepted_once_lifted(tmp_path: Path):
    keys = Keys(KeyRing.from_file(_write(tmp_path / "keys.yaml", "leaked-1", "other-key-1")))
    await keys.revoke(hash_key("leaked-1"))
    assert "revoked" in _refused(keys, "leaked-1") and keys.authenticate("Bearer other-key-1").id == "acme"
    await keys.unrevoke(hash_key("leaked-1"))
    assert keys.authenticate("Bearer leaked-1").id == "acme"


@pytest.mark.integration
async def test_a_revocation_reaches_every_replica_through_redis(tmp_path: Path, redis7_server):
    url = flushed(redis7_server)
    ring = KeyRing.from_file(_write(tmp_path / "keys.yaml", "leaked-1"))
    a, b = (Keys(ring, redis=open_redis(url), refresh_s=0.1) for _ in range(2))
    await b.start()
    try:
        await a.revoke(hash_key("leaked-1"))
        await eventually(lambda: _revoked(b, "leaked-1"), "the other replica refuses it", timeout_s=30)
        await a.unrevoke(hash_key("leaked-1"))
        await eventually(lambda: not _revoked(b, "leaked-1"), "the other replica accepts it again", timeout_s=30)
    finally:
        await b.stop()


def _revoked(keys: Keys, key: str) -> bool:
    try:
        keys.authenticate(f"Bearer {key}")
    except OpenAIError:
        return True
    return False


def test_an_operator_revokes_a_key_through_the_admin_api(tmp_path: Path):
    path = _write(tmp_path / "keys.yaml", "leaked-1", "other-key-1")
    settings = Settings(policy=write_policy(tmp_path / "p.yaml", [DEAD], [DEAD]), embedder=None, redis_url=None,
                        api_keys_file=path, admin_key="admin-key-0123456789")
    admin = {"Authorization": "Bearer admin-key-0123456789"}

    async def run() -> list[httpx.Response]:
        async with in_process(settings, KeyRing.from_file(path)) as c:
            models = "/v1/models"
            before = await c.get(models, headers={"Authorization": "Bearer leaked-1"})
            not_admin = await c.post("/admin/keys/revoke", json={"key": "leaked-1"},
                                     headers={"Authorization": "Bearer other-key-1"})
            revoked = await c.post("/admin/keys/revoke", json={"key": "leaked-1"}, headers=admin)
            after = await c.get(models, headers={"Authorization": "Bearer leaked-1"})
            other = await c.get(models, headers={"Authorization": "Bearer other-key-1"})
            bad = await c.post("/admin/keys/revoke", json={"sha256": "abc"}, headers=admin)
            return [before, not_admin, revoked, after, other, bad]

    before, not_admin, revoked, after, other, bad = asyncio.run(run())
    assert before.status_code == 200 and not_admin.status_code == 401 and revoked.json() == {"ok": True}
    assert after.status_code == 401 and "revoked" in after.json()["error"]["message"]
    assert other.status_code == 200 and bad.status_code == 400 and bad.json()["error"]["param"] == "sha256"
