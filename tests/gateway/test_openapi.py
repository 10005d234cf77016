"""`/openapi.json` describes the gateway as it is: every route it serves, and exactly the limits it enforces.

Each limit is probed on both sides of its boundary against a live gateway: the document allows the body exactly
when the gateway accepts it (anything but 400). The fuzz tests (tests/fuzz/test_openapi_fuzz.py) cover the rest.
"""

from __future__ import annotations

import json
import re
from contextlib import ExitStack

import httpx
import jsonschema
import pytest
from starlette.routing import Route

from tests.gateway.conftest import KEYS, write_policy
from tests.support.instant_upstream import make_app
from tests.support.servers import aiohttp_server, gateway_server
from tiergate.gateway.openapi import openapi_document
from tiergate.gateway.settings import Settings

DOC = json.loads(openapi_document(embedding_dim=384))  # the gateway below has the default embedder
API = {"Authorization": "Bearer key-alpha-1"}
EDGE = {"Authorization": "Bearer edge-t", "x-tiergate-node-claim": "openapi-probe-claim-0001"}
CHAT = {"model": "auto", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
TEXT = {"model": "auto", "prompt": "hi", "max_tokens": 2}
NODE = {"node_id": "n1", "url": "http://127.0.0.1:1", "model": "m"}

# (path, body, allowed): the base body with one field changed; None removes the field.
PROBES = [
    *[("/v1/chat/completions", {**CHAT, **change}, ok) for change, ok in [
        ({}, True), ({"messages": []}, False),
        ({"max_tokens": 0}, False), ({"max_tokens": 1}, True), ({"max_tokens": None}, True),
        ({"max_completion_tokens": 0}, False), ({"max_completion_tokens": 1}, True),
        ({"max_tokens": 0, "max_completion_tokens": 1}, True),  # max_completion_tokens takes precedence
        ({"max_tokens": 0, "max_completion_tokens": None}, False),
        ({"temperature": -0.01}, False), ({"temperature": 0}, True), ({"temperature": 2}, True),
        ({"temperature": 2.01}, False),
        ({"top_p": 0}, False), ({"top_p": 0.01}, True), ({"top_p": 1}, True), ({"top_p": 1.01}, False),
        ({"n": 0}, False), ({"n": 1}, True), ({"n": 2}, True), ({"n": 8}, True), ({"n": 9}, False),
        ({"n": None}, True),
        ({"n_predict": 9}, False), ({"n_predict": None}, True), ({"priority": 1}, False), ({"priority": 0}, True),
        ({"ignore_eos": True}, False), ({"ignore_eos": False}, True), ({"best_of": 2}, False), ({"best_of": 1}, True),
        ({"min_tokens": 1}, False), ({"min_tokens": 0}, True), ({"id_slot": 0}, False), ({"id_slot": -1}, True),
        ({"reasoning_effort": "low"}, True),  # any other unmodelled field is allowed (and forwarded)
    ]],
    *[("/v1/completions", {**TEXT, **change}, ok) for change, ok in [
        ({}, True), ({"prompt": ""}, True), ({"prompt": []}, False), ({"prompt": ["a"]}, True),
        ({"prompt": ["a", "b"]}, True), ({"prompt": ["a"] * 8}, True), ({"prompt": ["a"] * 9}, False),
        ({"prompt": ["a"] * 4, "n": 2}, True), ({"prompt": ["a"] * 3, "n": 3}, False),
        ({"prompt": ["a", "b"], "n": 4}, True), ({"prompt": ["a", "b"], "n": 5}, False), ({"prompt": [1, 2]}, False),
        ({"max_tokens": 0}, False), ({"max_tokens": 1}, True),
        ({"temperature": 2.01}, False), ({"top_p": 0}, False), ({"n": 2}, True), ({"n": 9}, False), ({"n": 1}, True),
        ({"best_of": 2}, False), ({"best_of": 1}, True), ({"best_of": None}, True),
        ({"max_completion_tokens": 9}, False), ({"max_completion_tokens": None}, True),
        ({"n_predict": 9}, False), ({"use_beam_search": True}, False), ({"use_beam_search": False}, True),
    ]],
    *[("/v1/embeddings", {"model": "tiergate-embed", "input": "hi", **change}, ok) for change, ok in [
        ({}, True), ({"input": ""}, False), ({"input": []}, False), ({"input": ["a"] * 256}, True),
        ({"input": ["a"] * 257}, False), ({"input": ["a", ""]}, False), ({"input": [1, 2]}, False),
        ({"encoding_format": "base64"}, True), ({"encoding_format": "int8"}, False), ({"dimensions": 0}, False),
        ({"dimensions": 384}, True), ({"dimensions": 383}, False), ({"user": "u"}, True),
    ]],
    *[("/edge/v1/heartbeat", {**NODE, **change}, ok) for change, ok in [
        ({}, True), ({"node_id": ""}, False), ({"url": "ftp://x"}, False), ({"url": "https://127.0.0.1"}, True),
        ({"node_id": "a b"}, False), ({"node_id": "n1.edge-2:x_y"}, True), ({"node_id": "-n"}, False),
        ({"url": "http://127.0.0.1:1/v1"}, True), ({"url": "http://127.0.0.1:1/"}, True),
        ({"url": "http://127.0.0.1:1/latest/meta-data"}, False), ({"url": "http://127.0.0.1:1/v1?"}, False),
        ({"url": "http://127.0.0.1:1/#x"}, False), ({"url": "http://user:pw@127.0.0.1:1"}, False),
        ({"url": "HTTP://127.0.0.1:1"}, False), ({"url": "http://127.0.0.1:"}, False),
        ({"url": "http://[::1]:1"}, True),
        ({"slots": 0}, False), ({"slots": 1}, True), ({"busy": -1}, False), ({"busy": 0}, True),
        ({"queued": -1}, False), ({"queued": 0}, True),
    ]],
    *[("/edge/v1/deregister", body, ok) for body, ok in [
        ({"node_id": "n1"}, True), ({"node_id": "n1", "tier": None}, True), ({"node_id": ""}, False),
        ({"node_id": None}, False), ({}, False), ({"node_id": "n1", "slots": 1}, False), ({"node_id": "a/b"}, False),
    ]],
]


@pytest.fixture(scope="module")
def gw(tmp_path_factory, embedder_dir):
    with ExitStack() as es:  # with the real embedder: /v1/embeddings' limits are probed as the gateway checks them
        edge = es.enter_context(aiohttp_server(make_app(8, model="edge-model")))
        cloud = es.enter_context(aiohttp_server(make_app(8, model="cloud-model")))
        policy = write_policy(tmp_path_factory.mktemp("openapi-gw") / "policy.yaml", [edge.url], [cloud.url])
        yield es.enter_context(gateway_server(Settings(policy=policy, embedder=embedder_dir, redis_url=None,
                                                       edge_token="edge-t", admin_key="adm"), keyring=KEYS))


def allowed_by_document(path: str, body: dict) -> bool:
    schema = DOC["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return jsonschema.Draft202012Validator({**schema, **DOC}).is_valid(body)


@pytest.mark.parametrize("path, body, allowed", PROBES, ids=[f"{p} {json.dumps(b)}" for p, b, _ in PROBES])
def test_the_document_allows_exactly_what_the_gateway_accepts(gw, path, body, allowed):
    r = httpx.post(gw.url + path, json=body, headers=EDGE if path.startswith("/edge/") else API, timeout=30)
    assert r.status_code < 500, r.text
    assert (r.status_code != 400) is allowed, (r.status_code, r.text[:300])
    assert allowed_by_document(path, body) is allowed


def test_every_route_is_documented_and_every_documented_route_exists(gw):
    routes = gw.server.config.app.routes
    served = {(re.sub(r":\w+}", "}", route.path), method.lower()) for route in routes if isinstance(route, Route)
              for method in route.methods - {"HEAD"}}
    # the status page's own CSS and JS: files, not API operations
    assert [r.path for r in routes if not isinstance(r, Route)] == ["/dashboard/static"]
    documented = {(path, method) for path, item in DOC["paths"].items() for method in item}
    assert served == documented


def test_every_operation_states_its_auth_and_errors():
    schemes = DOC["components"]["securitySchemes"]
    public = {"/healthz", "/readyz", "/openapi.json"}
    for path, item in DOC["paths"].items():
        for op in item.values():
            security = [name for requirement in op.get("security", []) for name in requirement]
            assert set(security) <= set(schemes)
            assert bool(security) is (path not in public), path
            if path == "/metrics":  # the key is optional: an empty requirement stands for "none"
                assert op["security"] == [{"metricsKey": []}, {}]
            if path.startswith("/admin/"):
                assert security == ["adminKey"]
            if path.startswith("/dashboard"):
                assert security[0] == "adminKey"
            if path.startswith("/edge/"):
                assert security == ["edgeToken", "nodeKey"]
            if security and path != "/dashboard":  # the page itself answers people in HTML
                # Anthropic's clients read Anthropic's error shape
                shape = "AnthropicError" if path.startswith("/v1/messages") else "Error"
                assert op["responses"]["401"]["content"]["application/json"]["schema"] == {
                    "$ref": f"#/components/schemas/{shape}"}


def test_an_unknown_embedding_model_is_outside_the_document_and_a_404(gw):
    body = {"model": "text-embedding-3-small", "input": "hi"}
    r = httpx.post(gw.url + "/v1/embeddings", json=body, headers=API, timeout=30)
    assert r.status_code == 404 and not allowed_by_document("/v1/embeddings", body)


def test_the_gateway_serves_this_document(gw):
    r = httpx.get(gw.url + "/openapi.json")
    assert r.status_code == 200 and r.json() == DOC
