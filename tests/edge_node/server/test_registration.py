"""Registrar: heartbeats with the contract's payload and token, backoff while the gateway is away, deregister."""

from __future__ import annotations

import asyncio

from aiohttp import web
from structlog.testing import capture_logs

from tests.support.servers import aiohttp_server, free_port
from tiergate.core.edge_identity import CLAIM_HEADER, CLAIM_PATTERN
from tiergate.edge_node.engine.engine import EngineStats
from tiergate.edge_node.server.registration import NodeIdentity, Registrar


def stats() -> EngineStats:
    return EngineStats(slots=4, busy=1, queued=2, ctx_per_slot=1024, kv_cells_used=10, kv_cells_total=4096)


IDENT = NodeIdentity("node-1", "http://10.1.1.1:8081", "edge-model")


async def until_registered(reg: Registrar, timeout_s: float) -> None:
    """Poll until the running loop has registered, for at most `timeout_s` (the caller checks the outcome)."""
    for _ in range(int(timeout_s / 0.02)):
        if reg.registered:
            return
        await asyncio.sleep(0.02)


def fake_gateway(received: list, status: int = 200) -> web.Application:
    async def heartbeat(request: web.Request):
        received.append(("heartbeat", request.headers.get("Authorization"), await request.json()))
        return web.json_response({"ok": status < 300}, status=status)

    async def deregister(request: web.Request):
        received.append(("deregister", request.headers.get("Authorization"), await request.json()))
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/edge/v1/heartbeat", heartbeat)
    app.router.add_post("/edge/v1/deregister", deregister)
    return app


def test_heartbeat_payload_and_token_follow_the_contract():
    received: list = []
    with aiohttp_server(fake_gateway(received)) as gw:

        async def scenario():
            reg = Registrar(gw.url + "/", "s3cret", IDENT, stats)
            await reg.start()
            try:
                await until_registered(reg, 2.0)
                ok = await reg.deregister()
            finally:
                await reg.stop()
            return reg, ok

        reg, ok = asyncio.run(scenario())
    kind, auth, body = received[0]
    assert kind == "heartbeat" and auth == "Bearer s3cret"
    assert body == {"node_id": "node-1", "url": "http://10.1.1.1:8081", "model": "edge-model", "slots": 4,
                    "busy": 1, "queued": 2, "ctx": 1024, "tokens_per_s": 0.0}
    assert ok and received[-1] == ("deregister", "Bearer s3cret", {"node_id": "node-1"})
    assert not reg.registered


def test_unreachable_gateway_backs_off_exponentially_and_recovers():
    port = free_port()  # nothing listens here yet

    async def scenario():
        reg = Registrar(f"http://127.0.0.1:{port}", "t", IDENT, stats, interval_s=1.0, max_backoff_s=8.0)
        try:
            delays = []
            for _ in range(5):
                assert await reg.heartbeat_once() is False
                delays.append(reg.next_delay())
            return reg.failures, delays
        finally:
            await reg.stop()

    failures, delays = asyncio.run(scenario())
    assert failures == 5
    # 1, 2, 4, 8, 8 seconds (+-20% jitter): growing, then capped
    for d, base in zip(delays, [1, 2, 4, 8, 8], strict=True):
        assert 0.8 * base <= d <= 1.2 * base

    received: list = []
    with aiohttp_server(fake_gateway(received), port=port):

        async def recover():
            reg = Registrar(f"http://127.0.0.1:{port}", "t", IDENT, stats, interval_s=1.0)
            try:
                reg.failures = 4
                ok = await reg.heartbeat_once()
                return ok, reg.failures, reg.next_delay()
            finally:
                await reg.stop()

        ok, failures, delay = asyncio.run(recover())
    assert ok and failures == 0 and delay == 1.0


def test_rejected_token_counts_as_failure():
    received: list = []
    with aiohttp_server(fake_gateway(received, status=401)) as gw:

        async def scenario():
            reg = Registrar(gw.url, "wrong", IDENT, stats)
            try:
                return await reg.heartbeat_once(), reg.failures, reg.registered
            finally:
                await reg.stop()

        assert asyncio.run(scenario()) == (False, 1, False)


def test_optional_tier_is_sent_when_configured():
    reg = Registrar("http://gw", "t", IDENT, stats, tier="edge-eu")
    assert reg.payload()["tier"] == "edge-eu"


def test_the_heartbeat_loop_survives_junk_answers_and_its_own_errors():
    calls = {"n": 0}

    async def junk(request: web.Request):
        calls["n"] += 1
        if calls["n"] <= 2:  # a broken proxy in front of the gateway: bytes that are not what they claim
            return web.Response(body=b"\xff\xfe bad gateway \xc3", status=502, content_type="text/plain",
                                charset="utf-8")
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/edge/v1/heartbeat", junk)
    broken_once = {"raised": False}

    def flaky_stats() -> EngineStats:
        if calls["n"] == 2 and not broken_once["raised"]:  # and a bug of our own, once
            broken_once["raised"] = True
            raise RuntimeError("stats exploded")
        return stats()

    with aiohttp_server(app) as gw:

        async def scenario():
            reg = Registrar(gw.url, "t", IDENT, flaky_stats, interval_s=0.02, max_backoff_s=0.05)
            await reg.start()
            try:
                await until_registered(reg, 4.0)
                return reg.registered, reg._task.done()
            finally:
                await reg.stop()

        assert asyncio.run(scenario()) == (True, False)  # recovered, and the loop is still running
    assert broken_once["raised"] and calls["n"] >= 3


def test_its_own_key_is_presented_before_the_token_and_one_claim_goes_with_every_request():
    claims: list = []

    async def record(request: web.Request):
        claims.append((request.path, request.headers.get("Authorization"), request.headers.get(CLAIM_HEADER)))
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/edge/v1/heartbeat", record)
    app.router.add_post("/edge/v1/deregister", record)
    with aiohttp_server(app) as gw:

        async def scenario():
            reg = Registrar(gw.url, "shared-token", IDENT, stats, node_key="the-node-key-0123456789")
            other = Registrar(gw.url, "shared-token", IDENT, stats)
            try:
                await reg.heartbeat_once()
                await reg.heartbeat_once()
                await other.heartbeat_once()
                await reg.deregister()
            finally:
                await reg.stop()
                await other.stop()

        asyncio.run(scenario())
    mine = [c for c in claims if c[1] == "Bearer the-node-key-0123456789"]
    assert [p for p, _, _ in mine] == ["/edge/v1/heartbeat", "/edge/v1/heartbeat", "/edge/v1/deregister"]
    assert len({c for _, _, c in mine}) == 1 and CLAIM_PATTERN.fullmatch(mine[0][2])
    (theirs,) = [c for c in claims if c[1] == "Bearer shared-token"]
    assert theirs[2] != mine[0][2]  # each process makes up its own claim


def test_a_node_id_held_by_another_node_is_logged_with_what_to_do():
    with aiohttp_server(fake_gateway([], status=409)) as gw:

        async def scenario():
            reg = Registrar(gw.url, "t", IDENT, stats)
            try:
                with capture_logs() as logs:
                    ok = await reg.heartbeat_once()
                return ok, logs
            finally:
                await reg.stop()

        ok, logs = asyncio.run(scenario())
    assert not ok and any("give each node its own id" in (e.get("hint") or "") for e in logs)
