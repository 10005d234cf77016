"""The URLs a registering edge node may give: their shape, and where their hosts may point."""

from __future__ import annotations

import ipaddress

import pytest

from tiergate.gateway.pools.edge_urls import UrlError, UrlPolicy, base_url


@pytest.mark.parametrize("url, base", [
    ("http://10.0.0.5:8081", "http://10.0.0.5:8081"), ("https://edge-1.example:443/", "https://edge-1.example:443"),
    ("http://10.0.0.5:8081/v1", "http://10.0.0.5:8081"), ("http://[fd00::5]:8081/v1/", "http://[fd00::5]:8081"),
    ("http://Edge.Local", "http://edge.local"),
])
def test_a_base_url_is_kept_as_scheme_host_and_port(url, base):
    assert base_url(url) == base


@pytest.mark.parametrize("url, says", [
    ("http://169.254.169.254/latest/meta-data/?", "no query"),  # the URL: a `?` swallows the path
    ("http://10.0.0.5:8081/v1?x=1", "no query"), ("http://10.0.0.5:8081#frag", "no fragment"),
    ("http://10.0.0.5:8081/?", "no query"), ("http://admin:pw@10.0.0.5:8081", "credentials"),
    ("http://admin@10.0.0.5", "credentials"), ("ftp://10.0.0.5", "http:// or https://"),
    ("file:///etc/passwd", "http:// or https://"), ("gopher://10.0.0.5:70", "http:// or https://"),
    ("HTTP://10.0.0.5", "http:// or https://"), ("//10.0.0.5", "http:// or https://"),
    ("http://10.0.0.5:8081/admin", "no path"), ("http://169.254.169.254/latest/meta-data", "no path"),
    ("http://10.0.0.5:99999", "invalid port"), ("http://10.0.0.5:", "invalid port"), ("http://10.0.0.5:0", "port"),
    ("http://", "no host"), ("http://under_score.example", "neither an IP"), ("http://a b", "spaces"),
    ("http://10.0.0.5\r\nX: y", "control"), ("http://[fe80::1%25eth0]:80", "neither an IP"),
    ("http://[0]:80", "not a valid URL"), ("http://[::1:80", "not a valid URL"),  # found by fuzzing: were 500s
])
def test_urls_the_gateway_will_not_call_are_refused_saying_why(url, says):
    with pytest.raises(UrlError, match=says):
        base_url(url)


def check(policy: UrlPolicy, url: str, *, local: bool = False) -> str | None:
    import asyncio

    try:
        asyncio.run(policy.check(url, from_loopback=local))
    except UrlError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("url, says", [
    ("http://169.254.169.254", "metadata"), ("http://169.254.1.1:80", "link-local"),
    ("http://[fe80::1]:80", "link-local"), ("http://[fd00:ec2::254]", "metadata"),
    ("http://100.100.100.200", "metadata"), ("http://[::ffff:169.254.169.254]", "metadata"),
    ("http://0.0.0.0:8081", "not a unicast"), ("http://[::]:8081", "not a unicast"),
    ("http://224.0.0.1", "not a unicast"), ("http://255.255.255.255", "not a unicast"),
    ("http://127.0.0.1:6379", "loopback"), ("http://[::1]:8081", "loopback"),
    ("http://[::ffff:127.0.0.1]:8081", "loopback"),
])
def test_addresses_that_are_never_called_from_a_remote_registration(url, says):
    why = check(UrlPolicy(), url)
    assert why is not None and says in why, why


def test_loopback_is_allowed_only_to_a_node_on_this_machine_and_private_networks_by_default():
    policy = UrlPolicy()
    assert check(policy, "http://127.0.0.1:8081", local=True) is None
    assert check(policy, "http://[::1]:8081", local=True) is None
    assert check(policy, "http://169.254.169.254", local=True) is not None  # never, from anywhere
    for url in ("http://10.0.3.17:8081", "http://192.168.1.5", "http://[fd00::5]:8081", "https://203.0.113.9"):
        assert check(policy, url) is None, url


def test_listed_networks_are_the_only_ones_allowed():
    policy = UrlPolicy([ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("fd00::/8")])
    assert check(policy, "http://10.0.3.17:8081") is None and check(policy, "http://[fd00::5]") is None
    why = check(policy, "http://192.168.1.5:8081")
    assert why is not None and "outside TIERGATE_EDGE_NETWORKS (10.0.0.0/8, fd00::/8)" in why
    assert check(policy, "http://127.0.0.1:8081", local=True) is None  # a local node, whatever the list


def test_a_host_name_must_resolve_only_to_allowed_addresses():
    answers = {"edge.lan": ["10.0.0.7"], "sneaky.example": ["10.0.0.8", "169.254.169.254"],
               "metadata.google.internal": ["169.254.169.254"], "empty.example": []}
    asked: list[str] = []

    async def resolve(host: str, port: int) -> list[str]:
        asked.append(host)
        if host not in answers:
            raise OSError(-2, "Name or service not known")
        return answers[host]

    policy = UrlPolicy(resolver=resolve)
    assert check(policy, "http://edge.lan:8081") is None
    assert "resolves to 169.254.169.254 is a cloud metadata service" in check(policy, "http://sneaky.example")
    assert "metadata" in check(policy, "http://metadata.google.internal")
    assert "does not resolve" in check(policy, "http://empty.example")
    assert "does not resolve" in check(policy, "http://nowhere.example")
    assert check(policy, "http://edge.lan:9999") is None
    assert asked.count("edge.lan") == 1  # remembered for a while: heartbeats every 2 s do not each resolve it
