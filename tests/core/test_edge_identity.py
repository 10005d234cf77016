"""Node keys, API keys and loopback: what the edge node and the gateway must compute alike."""

from __future__ import annotations

import hashlib
import hmac
import shutil
import subprocess

import pytest

from tiergate.core.edge_identity import CLAIM_PATTERN, NODE_ID_PATTERN, is_loopback, node_api_key, node_key

SECRET = "s" * 40


def test_a_node_key_is_the_documented_hmac_and_openssl_computes_it_too():
    key = node_key(SECRET, "jetson-01")
    assert key == hmac.new(SECRET.encode(), b"tiergate-edge-node:jetson-01", hashlib.sha256).hexdigest()
    if (openssl := shutil.which("openssl")) is not None:
        out = subprocess.run([openssl, "dgst", "-sha256", "-hmac", SECRET], input=b"tiergate-edge-node:jetson-01",
                             capture_output=True, check=True).stdout.decode()
        assert out.strip().endswith(key)


def test_keys_differ_per_node_per_secret_and_per_use():
    a, b = node_key(SECRET, "a"), node_key(SECRET, "b")
    assert len({a, b, node_key("t" * 40, "a"), node_api_key(a), node_api_key(b)}) == 5
    assert node_api_key(a) == hmac.new(a.encode(), b"tiergate-edge-api", hashlib.sha256).hexdigest()


@pytest.mark.parametrize("node_id, ok", [("jetson-01", True), ("n1.edge:2_x", True), ("a" * 128, True),
                                         ("a" * 129, False), ("", False), ("-a", False), ("a b", False),
                                         ("a/b", False), ("é", False), ("a\n", False)])
def test_node_ids_are_plain_names(node_id, ok):
    assert bool(NODE_ID_PATTERN.fullmatch(node_id)) is ok


def test_claims_are_long_printable_values():
    assert CLAIM_PATTERN.fullmatch("x" * 16) and not CLAIM_PATTERN.fullmatch("x" * 15)
    assert not CLAIM_PATTERN.fullmatch("x" * 15 + " ")


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("127.8.9.10", True), ("::1", True),
                                            ("[::1]", True), ("localhost", True), ("::ffff:127.0.0.1", True),
                                            ("0.0.0.0", False), ("::", False), ("10.0.0.1", False),
                                            ("example.com", False), ("", False)])
def test_loopback(host, loopback):
    assert is_loopback(host) is loopback
