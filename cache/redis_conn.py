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

from typing import Any
from urllib.parse import urlsplit, urlunsplit

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster

__all__ = ["AnyRedis", "is_cluster", "open_redis", "safe_url"]

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
