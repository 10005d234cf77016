"""Byte-level fuzzing of every HTTP surface, with a fixed seed: no byte sequence gets a 5xx, a hang or no answer.

The cases (`tests/support/fuzz_cases.py`) are valid requests mutated at the byte level: invalid UTF-8, lone surrogates,
truncation, deep nesting, huge numbers, NaN/Infinity, duplicate keys, wrong types and content types, odd headers;
each is sent as raw bytes over a socket (`tests/support/fuzz_client.py`). `python -m bench.fuzz` is the long run of the
same cases (docs/reliability.md, "Byte-level fuzzing"). Bugs the fuzzing found are pinned as plain tests below.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import pytest

from tests.gateway.conftest import stack
from tests.support.fuzz_cases import Target, generate
from tests.support.fuzz_client import UVICORN_400, Result, send
from tests.support.registration import CLAIM

HANG_S = 60.0  # a case unanswered this long is a hang (instant backends, a tiny model: answers take milliseconds)

AUTH = {"Authorization": "Bearer key-alpha-1", "content-type": "application/json"}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, embedder_dir):
    with stack(tmp_path_factory.mktemp("byte-fuzz-gw"), settings={"admin_key": "fuzz-admin-key", "embedder": embedder_dir,
                                                                  "edge_token": "fuzz-edge-token"}) as s:
        yield s


# ---- the bug the issue names: invalid UTF-8 in a completion body was a 500 (fixed in core/wire.py) -------------

@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", b'{"model":"auto","messages":[{"role":"user","content":"\xff\xfe"}]}'),
    ("/v1/completions", b'{"model":"auto","prompt":"\xff\xfe","max_tokens":4}'),
], ids=["chat", "text"])
def test_invalid_utf8_in_a_completion_body_is_a_400(gateway, path, body):
    r = httpx.post(gateway["gw"].url + path, content=body, headers=AUTH, timeout=30)
    assert r.status_code == 400, (r.status_code, r.text[:300])
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == "invalid_json", err
    assert "UTF-8" in err["message"]


# ---- found by this fuzzing, fixed: a string that is not UTF-8 where the decoders did not expect one -------------

def test_an_unknown_field_whose_name_is_not_utf8_is_a_400(gateway):
    """The request structs skip unknown keys without decoding them; reading the raw fields raised UnicodeDecodeError."""
    body = b'{"model":"auto","prompt":"hi","max_\xafokens":7}'
    r = httpx.post(gateway["gw"].url + "/v1/completions", content=body, headers=AUTH, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json", (r.status_code, r.text[:300])


@pytest.mark.parametrize("path, body", [
    ("/edge/v1/heartbeat", b'{"node_id":"n\xff","url":"http://127.0.0.1:9","model":"m"}'),
    ("/edge/v1/deregister", b'{"node_id":"n\xed\xa0\x80"}'),
], ids=["heartbeat", "deregister"])
def test_edge_registration_that_is_not_utf8_is_a_400(gateway, path, body):
    r = httpx.post(gateway["gw"].url + path, content=body, timeout=30,
                   headers={"Authorization": "Bearer fuzz-edge-token", "content-type": "application/json", **CLAIM})
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert r.json()["error"]["type"] == "invalid_request_error"


# ---- the deterministic run -----------------------------------------------------------------------------------

SEED = 0
CASES = {"gateway-api": 192, "gateway-surfaces": 136, "gateway-admin": 68, "edge-registration": 68, "edge-node": 136}


def run(port: int, surface: str, node_url: str) -> list[Result]:
    target = Target(api_key="key-alpha-1", admin_key="fuzz-admin-key", edge_token="fuzz-edge-token",
                    node_url=node_url or "http://127.0.0.1:9")

    async def main() -> list[Result]:
        return [await send(c, "127.0.0.1", port, HANG_S) for c in generate(surface, target, SEED, CASES[surface])]

    return asyncio.run(main())


def check_run(results: list[Result]) -> Counter:
    """Every case answered (no 5xx, no hang, no connection closed unanswered) in the shapes the API promises."""
    verdicts = Counter(r.verdict for r in results)
    bad = [r for r in results if r.verdict != "answered"]
    assert not bad, "\n".join(f"{r.verdict} {r.status}: {r.case.describe()} -> {r.excerpt!r}" for r in bad[:10])
    for r in results:
        if r.status >= 400:  # ours in the OpenAI shape; uvicorn's own only for bytes that are not HTTP
            assert r.shape == "openai" or r.excerpt == UVICORN_400, f"{r.case.describe()} -> {r.excerpt!r}"
        assert r.shape != "incomplete", f"{r.case.describe()} -> {r.excerpt!r}"
    return verdicts


def still_serves(url: str, path: str, body: dict, headers: dict) -> None:
    r = httpx.post(url + path, json=body, headers=headers, timeout=60)
    assert r.status_code == 200 and r.json()["choices"], r.text[:300]


@pytest.mark.parametrize("surface", ["gateway-api", "gateway-surfaces", "gateway-admin", "edge-registration"])
def test_no_byte_sequence_gets_a_5xx_from_the_gateway(gateway, tmp_path, surface):
    url = gateway["gw"].url
    if surface == "edge-registration":  # the nodes it registers must not receive the other surfaces' completions
        with stack(tmp_path, settings={"edge_token": "fuzz-edge-token"}) as other:
            results = run(other["gw"].port, surface, other["edges"][0].url)
            assert httpx.get(other["gw"].url + "/readyz", timeout=10).status_code == 200
    else:
        results = run(gateway["gw"].port, surface, gateway["edges"][0].url)
    verdicts = check_run(results)
    print(surface, dict(verdicts), dict(Counter(r.status for r in results)))
    still_serves(url, "/v1/chat/completions", {"model": "auto", "messages": [{"role": "user", "content": "hi"}]},
                 {"Authorization": "Bearer key-alpha-1"})
    assert httpx.get(url + "/readyz", timeout=10).status_code == 200


@pytest.mark.integration
def test_no_byte_sequence_gets_a_5xx_from_the_edge_node(edge_node):
    results = run(edge_node.port, "edge-node", "")
    verdicts = check_run(results)
    print("edge-node", dict(verdicts), dict(Counter(r.status for r in results)))
    still_serves(edge_node.url, "/v1/chat/completions",
                 {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}, {})
    assert edge_node.health()["status"] == "ok"
