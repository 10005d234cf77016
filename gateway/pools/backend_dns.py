"""Addresses no backend may have, checked again at every connection the gateway makes to a backend.

A registered node's host name is checked when it registers (`edge_urls`), but the HTTP clients resolve it again
when they connect; a name whose records change in between (DNS rebinding) would otherwise point the gateway at a
cloud metadata service with a tenant's prompt or a health poll. `GuardedResolver` sits in every backend client's
connector (upstream requests, edge health polls, cloud polls) and refuses such an address for any host. It cannot
apply the node-only rules (loopback, `TIERGATE_EDGE_NETWORKS`): it does not know which backend a name belongs to.

Tested in `tests/gateway/pools/test_edge_urls.py`.
"""

from __future__ import annotations

import ipaddress
import socket

from aiohttp import DefaultResolver
from aiohttp.abc import AbstractResolver, ResolveResult

__all__ = ["GuardedResolver", "never_a_backend"]

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

_METADATA = frozenset(ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200"))


def never_a_backend(addr: Address) -> str | None:
    """Why no backend, registered or configured, may be at `addr` (None: it may be)."""
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if addr in _METADATA:
        return f"{addr} is a cloud metadata service"
    if addr.is_link_local:
        return f"{addr} is link-local (where metadata services answer)"
    if addr.is_loopback:  # before is_reserved, which ::1 is too
        return None
    if addr.is_unspecified or addr.is_multicast or addr.is_reserved:
        return f"{addr} is not a unicast address"
    return None


class GuardedResolver(AbstractResolver):
    """aiohttp's resolver, refusing a host that resolves to an address no backend may have (`never_a_backend`),
    at every connection: what was checked at registration is checked again where it matters. aiohttp does not
    resolve IP literals, which the registration checked in full."""

    def __init__(self, inner: AbstractResolver | None = None) -> None:
        self._inner = inner or DefaultResolver()

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        for result in found:
            try:
                addr = ipaddress.ip_address(result["host"].split("%", 1)[0])
            except ValueError:
                raise OSError(f"host {host!r} resolved to {result['host']!r}, not an IP address") from None
            if why := never_a_backend(addr):
                raise OSError(f"host {host!r} now resolves to {why}: not connecting")
        return found

    async def close(self) -> None:
        await self._inner.close()
