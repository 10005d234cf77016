import pytest

from tiergate.core.errors import OpenAIError
from tiergate.core.types import Priority
from tiergate.gateway.app import create_app
from tiergate.gateway.auth import DEMO_KEY, KeyFileError, KeyRing, hash_key
from tiergate.gateway.settings import Settings


def test_demo_key_maps_to_demo_tenant():
    assert KeyRing.demo().authenticate(f"Bearer {DEMO_KEY}").id == "demo"


@pytest.mark.parametrize("header", [None, "", "Basic abc", "Bearer ", "Bearer wrong-key"])
def test_bad_or_missing_keys_are_401(header):
    with pytest.raises(OpenAIError) as ei:
        KeyRing.demo().authenticate(header)
    assert ei.value.status == 401 and ei.value.type == "authentication_error"


def test_key_file_with_hashed_and_plain_keys(tmp_path):
    f = tmp_path / "keys.yaml"
    f.write_text(f"""
tenants:
  acme: {{priority: high, requests_per_minute: 60, max_tokens: 256}}
  free: {{priority: low}}
keys:
  - {{tenant: acme, sha256: "{hash_key('acme-secret-1')}"}}
  - {{tenant: free, key: free-secret-1}}
""")
    ring = KeyRing.from_file(f)
    acme = ring.authenticate("Bearer acme-secret-1")
    assert (acme.id, acme.priority, acme.requests_per_minute, acme.max_tokens) == ("acme", Priority.HIGH, 60, 256)
    assert ring.authenticate("Bearer free-secret-1").priority is Priority.LOW
    assert "free-secret-1" not in repr(ring.__dict__)  # only digests are kept


def test_key_file_errors_name_line_and_field(tmp_path):
    f = tmp_path / "keys.yaml"
    f.write_text("tenants:\n  acme:\n    priority: high\n    max_tokens: -3\nkeys: []\n")
    with pytest.raises(KeyFileError) as ei:
        KeyRing.from_file(f)
    msg = str(ei.value)
    assert str(f) in msg and "line 4" in msg and "tenants.acme.max_tokens" in msg


def test_key_referring_to_unknown_tenant_is_rejected(tmp_path):
    f = tmp_path / "keys.yaml"
    f.write_text("tenants:\n  a: {}\nkeys:\n  - {tenant: b, key: long-enough-key}\n")
    with pytest.raises(KeyFileError, match="'b' is not one of the tenants"):
        KeyRing.from_file(f)


def test_inline_keys():
    ring = KeyRing.from_inline("k1-aaaa=alpha:high, k2-bbbb=beta")
    assert ring.authenticate("Bearer k1-aaaa").priority is Priority.HIGH
    assert ring.authenticate("Bearer k2-bbbb").id == "beta"


@pytest.mark.parametrize(("settings", "demo_accepted"), [
    ({}, True),  # nothing configured: the demo set-up accepts the documented demo key
    ({"demo_key": False}, False),  # e.g. the Helm chart: no key configured means no client gets in
    ({"api_keys": "k-1=alpha"}, False),  # configured keys replace the demo key
])
def test_the_gateway_accepts_the_demo_key_only_when_allowed_and_no_keys_are_configured(settings, demo_accepted):
    base = {"api_keys_file": None, "api_keys": None, "embedder": None, "redis_url": None}
    keyring = create_app(Settings(**(base | settings))).state.gateway.keys
    if demo_accepted:
        assert keyring.authenticate(f"Bearer {DEMO_KEY}").id == "demo"
    else:
        with pytest.raises(OpenAIError) as info:
            keyring.authenticate(f"Bearer {DEMO_KEY}")
        assert info.value.status == 401
