"""`gateway.settings`: TIERGATE_* settings validated with errors that name the variable. Here: the public demo key
is refused on a bind address that is not loopback (the other settings are tested where they are used)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tiergate.gateway.settings import Settings, is_loopback

NO_KEYS = {"api_keys_file": None, "api_keys": None}


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.0.1.1", True), ("localhost", True), ("LOCALHOST", True), ("::1", True),
    ("[::1]", True), ("0.0.0.0", False), ("::", False), ("", False), ("10.0.0.5", False), ("192.168.1.2", False),
    ("fe80::1", False), ("gateway.example.com", False), ("localhost.evil.com", False),
])
def test_what_counts_as_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "gateway.internal"])
def test_the_demo_key_on_a_non_loopback_bind_address_is_refused_naming_the_settings(host: str) -> None:
    with pytest.raises(ValidationError) as err:
        Settings(host=host, **NO_KEYS)
    message = str(err.value)
    assert "TIERGATE_DEMO_KEY" in message and f"TIERGATE_HOST={host!r}" in message
    assert "TIERGATE_API_KEYS_FILE" in message and "TIERGATE_DEMO_KEY=false" in message


@pytest.mark.parametrize("settings", [
    {"host": "127.0.0.1"},  # the demo: loopback only
    {"host": "0.0.0.0", "api_keys": "k-123456=alpha"},  # keys configured: the demo key is not served
    {"host": "0.0.0.0", "api_keys_file": "keys.yaml"},
    {"host": "0.0.0.0", "demo_key": False},  # no key at all: every request 401, but nothing public
])
def test_any_other_combination_is_accepted(settings: dict) -> None:
    Settings(**(NO_KEYS | settings))


def test_the_refusal_comes_from_the_environment_too_and_does_not_print_other_settings(monkeypatch) -> None:
    for name, value in {"TIERGATE_HOST": "0.0.0.0", "TIERGATE_API_KEYS": "", "TIERGATE_API_KEYS_FILE": "",
                        "TIERGATE_ADMIN_KEY": "admin-secret-value"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError) as err:
        Settings()
    assert "TIERGATE_DEMO_KEY" in str(err.value) and "admin-secret-value" not in str(err.value)
    monkeypatch.setenv("TIERGATE_DEMO_KEY", "false")
    assert Settings().host == "0.0.0.0"


def test_edge_registration_settings_are_checked_naming_the_variable(tmp_path) -> None:
    with pytest.raises(ValidationError, match="TIERGATE_EDGE_SECRET must be at least 32"):
        Settings(edge_secret="too-short")
    with pytest.raises(ValidationError, match="TIERGATE_EDGE_NETWORKS: '10.0.0/8x'"):
        Settings(edge_networks="10.0.0.0/8, 10.0.0/8x")
    assert [str(n) for n in Settings(edge_networks="10.0.0.0/8, fd00::/8").edge_network_list()] == \
        ["10.0.0.0/8", "fd00::/8"]
    (tmp_path / "ca.pem").write_text("not a certificate")
    with pytest.raises(ValidationError, match="TIERGATE_BACKEND_CA_FILE"):
        Settings(backend_ca_file=tmp_path / "ca.pem")
    with pytest.raises(ValidationError, match="TIERGATE_BACKEND_CA_FILE"):
        Settings(backend_ca_file=tmp_path / "missing.pem")
    assert Settings().backend_ssl() is None and Settings(edge_secret="", edge_networks="").edge_secret is None
