"""Which URLs a registered edge node may give the gateway to call back: its shape, and where its host may be.

A heartbeat's `url` is where the gateway will POST tenants' prompts and poll `/health`, so it is checked twice:

- its shape (`base_url`, in `parse_heartbeat`): `http` or `https`, a host and an optional port, no credentials
  (`user:pass@`), no query and no fragment (a `?` or `#` would swallow the path the gateway appends), and no path
  but `/` or `/v1`: the gateway appends the fixed `/v1/chat/completions`, `/v1/completions`, `/v1/models` and
  `/health`, nothing else;
- where its host is (`UrlPolicy.check`, in the registration endpoint): every address the host resolves to must be
  allowed. Never: link-local addresses (169.254.0.0/16 and fe80::/10, where cloud metadata services answer),
  other metadata services (fd00:ec2::254, 100.100.100.200), unspecified, multicast and reserved addresses.
  Loopback only when the heartbeat itself came from this machine (a loopback socket): a remote node naming
  127.0.0.1 would make the gateway call its own host's services. Anything else is allowed unless the operator lists
  networks (`TIERGATE_EDGE_NETWORKS`); then it must lie in one of them.

A host name is resolved when it is registered and re-checked every `cache_s`. The gateway's HTTP clients resolve it
again when they connect, through `backend_dns.GuardedResolver`, which refuses the addresses no backend may have (metadata,
link-local, unspecified, multicast, reserved), so a name whose records change after registration (DNS rebinding)
cannot point the gateway at a metadata service. The connect-time check does not know which backend a name belongs
to, so it cannot apply the loopback and `TIERGATE_EDGE_NETWORKS` rules, which are for nodes only: where those
matter, give nodes IP-literal URLs (`--advertise-url`), which are checked in full and never resolved again.

Tested in `tests/gateway/pools/test_edge_urls.py`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from urllib.parse import urlsplit

from tiergate.gateway.pools.backend_dns import never_a_backend

__all__ = ["Network", "UrlError", "UrlPolicy", "base_url"]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[list[str]]]

_MAX_URL = 2048
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")


class UrlError(ValueError):
    """A node URL the gateway will not call (the registration answers 400 naming `url`)."""


def base_url(url: str) -> str:
    """The node's base URL, `scheme://host[:port]`, or UrlError saying what is wrong with it."""
    if len(url) > _MAX_URL:
        raise UrlError(f"url is longer than {_MAX_URL} characters")
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise UrlError("url must not contain spaces or control characters")
    if "?" in url or "#" in url:
        raise UrlError(f"url must have no query and no fragment (`?`, `#`): the gateway appends fixed paths, got "
                       f"{url[:200]!r}")
    if not url.startswith(("http://", "https://")):
        raise UrlError(f"url must be http:// or https://, got {url[:200]!r}")
    try:
        parts = urlsplit(url)
    except ValueError as e:  # a bracketed host that is not an IP address, a bad IPv6 literal
        raise UrlError(f"url is not a valid URL: {e}") from None
    if "@" in parts.netloc:
        raise UrlError("url must not carry credentials (`user:password@`): the gateway presents the node's key")
    if parts.path not in ("", "/", "/v1", "/v1/"):
        raise UrlError(f"url must be the node's base URL (scheme, host, port) with no path but / or /v1, got path "
                       f"{parts.path[:200]!r}")
    try:
        port = parts.port
    except ValueError:
        port = -1
    if port in (-1, 0) or parts.netloc.endswith(":"):
        raise UrlError(f"url has an invalid port: {url[:200]!r}")
    host = parts.hostname or ""
    if not host:
        raise UrlError("url has no host")
    if "%" in host or _literal(host) is None and not _HOSTNAME.fullmatch(host):
        raise UrlError(f"url host {host[:200]!r} is neither an IP address nor a DNS name")
    netloc = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{netloc}" + (f":{port}" if port is not None else "")


def _literal(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


async def _getaddrinfo(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


class UrlPolicy:
    """Where registered nodes' URLs may point: `check(url, from_loopback=...)` raises UrlError when not there."""

    def __init__(self, networks: Sequence[Network] = (), *, resolver: Resolver | None = None,
                 resolve_timeout_s: float = 2.0, cache_s: float = 30.0) -> None:
        self.networks = tuple(networks)
        self._resolve = resolver or _getaddrinfo
        self._timeout_s = resolve_timeout_s
        self._cache_s = cache_s
        self._checked: dict[tuple[str, bool], tuple[float, str | None]] = {}  # (host, loopback) -> (until, error)

    def refusal(self, addr: Address, *, from_loopback: bool) -> str | None:
        """Why the gateway will not call `addr` (None: it may)."""
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        if why := never_a_backend(addr):
            return why
        if addr.is_loopback:
            return None if from_loopback else f"{addr} is loopback, and the node registered from another machine"
        if self.networks and not any(addr in net for net in self.networks):
            return f"{addr} is outside TIERGATE_EDGE_NETWORKS ({', '.join(map(str, self.networks))})"
        return None

    async def check(self, url: str, *, from_loopback: bool) -> None:
        """Raise UrlError unless every address of `url`'s host (a base URL, see `base_url`) is allowed."""
        parts = urlsplit(url)
        host = parts.hostname or ""
        literal = _literal(host)
        if literal is not None:
            if why := self.refusal(literal, from_loopback=from_loopback):
                raise UrlError(f"url {url!r}: {why}")
            return
        key, now = (host.lower(), from_loopback), time.monotonic()
        cached = self._checked.get(key)
        if cached is None or cached[0] < now:
            if len(self._checked) > 4096:
                self._checked.clear()
            cached = self._checked[key] = (now + self._cache_s, await self._host_refusal(host, from_loopback))
        if cached[1] is not None:
            raise UrlError(f"url {url!r}: {cached[1]}")

    async def _host_refusal(self, host: str, from_loopback: bool) -> str | None:
        try:
            async with asyncio.timeout(self._timeout_s):
                found = await self._resolve(host, 0)
        except (OSError, TimeoutError) as exc:
            return f"host {host!r} does not resolve ({type(exc).__name__}: {exc})"
        if not found:
            return f"host {host!r} does not resolve"
        for text in found:
            try:
                addr = ipaddress.ip_address(text.split("%", 1)[0])
            except ValueError:
                return f"host {host!r} resolves to {text!r}, not an IP address"
            if why := self.refusal(addr, from_loopback=from_loopback):
                return f"host {host!r} resolves to {why}"
        return None
