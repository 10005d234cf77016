"""Byte-level fuzzing of every HTTP surface, with a fixed seed: no byte sequence gets a 5xx, a hang or no answer.

The cases (`bench/fuzz/cases.py`) are valid requests mutated at the byte level: invalid UTF-8, lone surrogates,
truncation, deep nesting, huge numbers, NaN/Infinity, duplicate keys, wrong types and content types, odd headers;
each is sent as raw bytes over a socket (`bench/fuzz/client.py`). `python -m bench.fuzz` is the long run of the
same cases (docs/reliability.md, "Byte-level fuzzing"). Bugs the fuzzing found are pinned as plain tests below.
"""

from __future__ import annotations

import httpx
import pytest

from tests.gateway.conftest import stack

AUTH = {"Authorization": "Bearer key-alpha-1", "content-type": "application/json"}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with stack(tmp_path_factory.mktemp("byte-fuzz-gw"), settings={"admin_key": "fuzz-admin-key",
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
