"""How tiergate opens Redis: one server, or a Redis Cluster.

One URL names either. `redis://host:port/db` (or `rediss://`, `unix://`) is one server, with or without
replicas. `redis+cluster://host:port` (or `rediss+cluster://`) is a Redis Cluster. Any one node is enough
to start from, since the client learns the others from it; in Kubernetes that is the cluster's Service
name. Several start nodes can be listed, comma-separated (`redis+cluster://a:6379,b:6379`), so a
gateway can still start while one of them is down.

The cache and the rate limiter both open Redis through `open_redis`. Their keys carry hash tags
(`{...}`), so the keys that one script or pipeline touches together share a hash slot on a Cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import NoPermissionError, ResponseError

__all__ = ["VECTOR_SET_COMMANDS", "AnyRedis", "Capabilities", "is_cluster", "open_redis", "safe_url", "vector_sets"]

# What the Redis 8 layout runs. They belong to no ACL category in Redis 8.2 (`+@read +@write` does not grant
# them), so a restricted user needs each one by name.
VECTOR_SET_COMMANDS = ("vadd", "vsim", "vrem", "vcard", "vdim", "vinfo")

AnyRedis = Redis | RedisCluster

_CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def is_cluster(url: str) -> bool:
    return urlsplit(url).scheme in _CLUSTER_SCHEMES


def open_redis(url: str, **kwargs: Any) -> AnyRedis:
    """A client for `url`, with `kwargs` (timeouts, retry, max_connections...) applied to every
    connection. A Cluster client finds the cluster's nodes on its first command, not here."""
    if not is_cluster(url):
        return Redis.from_url(url, **kwargs)
    parts = urlsplit(url)
    scheme = _CLUSTER_SCHEMES[parts.scheme]
    auth, _, hosts = parts.netloc.rpartition("@")
    nodes = [h.strip() for h in hosts.split(",") if h.strip()]
    if not nodes:
        raise ValueError(f"{safe_url(url)}: a Redis Cluster URL needs at least one host:port")
    first = urlunsplit((scheme, f"{auth}@{nodes[0]}" if auth else nodes[0], parts.path, parts.query, ""))
    others = [ClusterNode(*_host_port(n)) for n in nodes[1:]]  # given the first one's auth, TLS, timeouts
    return RedisCluster.from_url(first, startup_nodes=others or None, **kwargs)


def _host_port(node: str) -> tuple[str, int]:
    host, _, port = node.rpartition(":")
    return (host.strip("[]"), int(port)) if host else (node, 6379)


def safe_url(url: str) -> str:
    """The URL without a password, for logs."""
    if "@" in url:
        scheme, rest = url.split("://", 1) if "://" in url else ("redis", url)
        return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"  # the last @: a password may hold one unencoded"
    return url


@dataclass(frozen=True, slots=True)
class Capabilities:
    vector_sets: bool  # Redis 8's VADD/VSIM are there and this user may run them
    note: str = ""  # why not (or a caveat), for the log and /readyz


async def vector_sets(client: AnyRedis, probe_key: str) -> Capabilities:
    """Whether this server offers vector sets to this user.

    `COMMAND LIST FILTERBY PATTERN` (Redis 7.0+, allowed to ordinary users) says whether the commands exist;
    then a harmless `VCARD` of a key that does not exist says whether this user may run them. Neither
    `MODULE LIST` (an admin command: denied to ordinary users) nor `COMMAND INFO` (redis-py 8.1's parser raises
    TypeError on Redis 7's reply for an unknown command) is used.
    """
    grants = " ".join(f"+{c}" for c in VECTOR_SET_COMMANDS)
    denied = Capabilities(False, f"this Redis user may not run the vector-set commands; grant them by name "
                                 f"(ACL SETUSER <user> {grants}): no ACL category covers them")
    try:
        if not await client.command_list(pattern="VADD"):
            return Capabilities(False, "this server has no vector sets (VADD): Redis 8 has them built in")
    except ResponseError:
        pass  # COMMAND LIST not allowed to this user: the probe below tells
    try:
        await client.execute_command("VCARD", probe_key)
    except NoPermissionError:
        return denied
    except ResponseError as exc:
        text = str(exc)
        if "NOPERM" in text.upper() or "no permissions" in text:
            return denied
        if "unknown command" in text.lower():
            return Capabilities(False, "this server has no vector sets (VADD): Redis 8 has them built in")
        return Capabilities(False, f"VCARD failed: {text}")
    return Capabilities(True)
