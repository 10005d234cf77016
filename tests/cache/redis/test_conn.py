"""One URL picks one server or a Redis Cluster; the cluster client is built lazily (no server needed here)."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from tiergate.cache.redis.conn import is_cluster, open_redis, safe_url


def test_plain_urls_open_one_server() -> None:
    for url in ("redis://127.0.0.1:6379/2", "rediss://h:6380/0", "unix:///run/redis.sock"):
        assert not is_cluster(url)
        client = open_redis(url, socket_timeout=0.5)
        assert type(client) is Redis
        assert client.connection_pool.connection_kwargs["socket_timeout"] == 0.5


def test_cluster_urls_list_every_start_node_with_the_first_ones_settings() -> None:
    url = "redis+cluster://user:s3cret@10.0.0.1:7000,10.0.0.2:7001,[::1]:7002"
    assert is_cluster(url)
    client = open_redis(url, socket_timeout=0.25, max_connections=7)
    assert isinstance(client, RedisCluster)
    nodes = client.nodes_manager.startup_nodes
    assert sorted(nodes) == ["10.0.0.1:7000", "10.0.0.2:7001", "::1:7002"]
    for node in nodes.values():  # auth and timeouts reach every start node, not only the first
        assert node.connection_kwargs["password"] == "s3cret" and node.connection_kwargs["username"] == "user"
        assert node.connection_kwargs["socket_timeout"] == 0.25
        assert node.max_connections == 7


def test_tls_cluster_url() -> None:
    client = open_redis("rediss+cluster://cache.example:6379")
    assert isinstance(client, RedisCluster)
    node = client.nodes_manager.startup_nodes["cache.example:6379"]
    assert node.connection_class.__name__ == "SSLConnection"


def test_a_cluster_url_without_hosts_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one host:port"):
        open_redis("redis+cluster://user:pw@")


def test_passwords_stay_out_of_logs() -> None:
    assert safe_url("redis+cluster://u:pw@a:1,b:2") == "redis+cluster://***@a:1,b:2"
    assert safe_url("redis://a:1/0") == "redis://a:1/0"
    assert safe_url("redis://u:p@ss@host:6379/0") == "redis://***@host:6379/0"  # an unencoded @ in the password
