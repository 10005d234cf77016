"""The connect-time address check every backend client makes (`gateway.pools.backend_dns`), through the real
upstream client and a real local server, with names resolved by a stand-in resolver."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from urllib.parse import urlsplit

import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult

from tests.support.servers import aiohttp_server
from tiergate.core.pool import Endpoint
from tiergate.core.types import Timeouts
from tiergate.gateway.pools.backend_dns import GuardedResolver, never_a_backend
from tiergate.gateway.upstream import UpstreamClient, UpstreamFailure

_TIMEOUTS = Timeouts(connect_s=30, first_byte_s=30, between_chunks_s=30)


class _Names(AbstractResolver):
    """A DNS whose answers the test sets (the rebinding attacker's)."""

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        return [ResolveResult(hostname=host, host=self.answers[host], port=port, family=family, proto=0, flags=0)]

    async def close(self) -> None:
        return None


def _backend(seen: list[str]) -> web.Application:
    async def chat(request: web.Request) -> web.Response:
        seen.append(await request.text())
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def _post(answers: dict[str, str], url: str) -> int:
    client = UpstreamClient(resolver=_Names(answers))
    await client.start()
    try:
        resp = await client.post(Endpoint("e", url, "m", "edge"), "/v1/chat/completions", b"{}", _TIMEOUTS, "rid",
                                 stream=False)
        resp.close()
        return resp.status
    finally:
        await client.close()


def test_a_name_that_now_points_at_a_metadata_service_is_not_connected_to():
    seen: list[str] = []
    with aiohttp_server(_backend(seen)) as srv:
        port = urlsplit(srv.url).port
        assert asyncio.run(_post({"node.test": "127.0.0.1"}, f"http://node.test:{port}")) == 200
        for rebound in ("169.254.169.254", "fe80::1", "0.0.0.0"):
            with pytest.raises(UpstreamFailure, match="not connecting"):
                asyncio.run(_post({"node.test": rebound}, f"http://node.test:{port}"))
    assert seen == ["{}"]  # only the request to the allowed address reached a server


@pytest.mark.parametrize("addr, refused", [
    ("169.254.169.254", True), ("100.100.100.200", True), ("fd00:ec2::254", True), ("::ffff:169.254.169.254", True),
    ("fe80::1", True), ("224.0.0.1", True), ("0.0.0.0", True), ("240.0.0.1", True),
    ("127.0.0.1", False), ("::1", False), ("10.0.0.5", False), ("203.0.113.7", False),
])
def test_which_addresses_no_backend_may_have(addr, refused):
    assert (never_a_backend(ipaddress.ip_address(addr)) is not None) == refused


def test_an_answer_that_is_not_an_address_is_refused():
    async def resolve() -> None:
        await GuardedResolver(_Names({"x.test": "not-an-ip"})).resolve("x.test", 80)

    with pytest.raises(OSError, match="not an IP address"):
        asyncio.run(resolve())
