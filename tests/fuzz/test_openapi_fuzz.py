"""schemathesis against a real gateway's own `/openapi.json` (uvicorn on a free port, instant `ok` backends).

Every operation the document lists is fuzzed with schema-conforming (positive) and schema-violating (negative)
inputs, with the credential its `security` names (API key, admin key or edge token); chat and text completions get
a valid `model` most of the time so that requests also get past routing into dispatch, streaming and the cache.
Edge registration is fuzzed on a gateway of its own, so that the nodes it registers do not receive the
completions. For every answer:
- the gateway's own code never answers 5xx (with healthy instant backends no upstream error is possible either);
- every error the document gives as `Error` is the OpenAI shape `{"error": {"message", "type", "code", "param"}}`,
  as `AnthropicError` (on /v1/messages) Anthropic's `{"type": "error", "error": {"type", "message"}}`;
- a 200 completion is a complete answer: JSON with choices, or SSE chunks ending in `data: [DONE]`; a 200 stream of
  the Messages or Responses API is named events ending in `message_stop` or `response.completed`/`incomplete`;
- schemathesis' own checks pass (status codes, content types, headers and bodies as documented; schema-valid
  inputs accepted, schema-violating ones refused);
- the gateway is still healthy and ready afterwards (no crash).
"""

from __future__ import annotations

import json
import warnings
from collections import Counter

import httpx
import jsonschema
import msgspec
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import load_all_checks
from schemathesis.specs.openapi.checks import (
    negative_data_rejection,
    positive_data_acceptance,
    response_schema_conformance,
)

from tests.gateway.conftest import stack
from tests.support.registration import CLAIM
from tiergate.gateway.openapi import openapi_document

AUTH = {"Authorization": "Bearer key-alpha-1"}
ADMIN_KEY, EDGE_TOKEN, METRICS_KEY = "fuzz-admin-key", "fuzz-edge-token", "fuzz-metrics-key-0123"
CREDENTIALS = {"apiKey": AUTH, "adminKey": {"Authorization": f"Bearer {ADMIN_KEY}"},
               "edgeToken": {"Authorization": f"Bearer {EDGE_TOKEN}", **CLAIM},
               "metricsKey": {"Authorization": f"Bearer {METRICS_KEY}"}}
MODELS = ["auto", "auto", "tiergate-edge", "tiergate-cloud", None]  # None: keep what schemathesis generated
SURFACES = {"/v1/messages", "/v1/messages/count_tokens", "/v1/responses"}  # served through the chat pipeline
_DOC = json.loads(openapi_document(embedding_dim=384))  # the fuzzed gateway serves the default embedder
OPERATIONS = [(path, method.upper()) for path, item in _DOC["paths"].items() for method in item]
EXAMPLES = {"POST": 150, "GET": 25}
load_all_checks()
# Relaxed checks, each for a reason:
# - positive_data_acceptance on /admin/cache/invalidate: "at least one of `entry`, `tenant`, `all=true`" cannot be
#   said with OpenAPI parameters (the operation's description says it); on /edge/v1/heartbeat: "every address the
#   URL's host resolves to is one the gateway calls" cannot be said in JSON Schema (the `url` description says it),
#   and a generated URL names hosts that do not resolve;
# - response_schema_conformance on SSE answers: the document gives `text/event-stream` as `{type: string}` (the
#   OpenAPI 3.1 way to say "a stream"); schemathesis reads that as the schema of each event, so SSE bodies are
#   checked by `check_answer` instead;
# - negative_data_rejection when the test itself made a negative case valid again (a valid key added); such a case
#   must still be refused when its body violates the document.


FUZZ_SETTINGS = {"admin_key": ADMIN_KEY, "edge_token": EDGE_TOKEN, "metrics_key": METRICS_KEY}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, embedder_dir):
    with stack(tmp_path_factory.mktemp("fuzz-gw"), settings=FUZZ_SETTINGS | {"embedder": embedder_dir}) as s:
        yield s


@pytest.fixture(scope="module")
def edge_gateway(tmp_path_factory):
    """Fuzzed heartbeats register nodes at made-up URLs: on this gateway they cannot disturb the completions."""
    with stack(tmp_path_factory.mktemp("fuzz-edge-gw"), settings=FUZZ_SETTINGS) as s:
        yield s


@pytest.fixture(scope="module")
def schema(gateway):
    live = httpx.get(gateway["gw"].url + "/openapi.json", timeout=10)
    assert live.status_code == 200 and live.json() == _DOC  # what we fuzz is what the gateway serves
    loaded = schemathesis.openapi.from_url(gateway["gw"].url + "/openapi.json")
    # every event of a whole answer: `n` × prompts answers of up to 8 chunks each, a usage chunk and [DONE]
    loaded.config.max_stream_events = 1000
    return loaded


def credentials(path: str, method: str) -> dict[str, str] | None:
    """The header for the first security scheme the operation accepts (None: it needs none)."""
    security = _DOC["paths"][path][method.lower()].get("security")
    return CREDENTIALS[next(iter(security[0]))] if security else None


def served(path: str) -> bool:
    """Answered by a tier (a completion, or a surface over the chat pipeline)?"""
    return path.endswith("completions") or path in SURFACES


def documented_error(path: str, method: str, status: int) -> str | None:
    """The error shape the document gives this answer (exact status first, then its `4XX`/`5XX` range): `Error`
    (OpenAI's), `AnthropicError`, or None when it is not documented as an error."""
    responses = _DOC["paths"][path][method.lower()]["responses"]
    documented = responses.get(str(status)) or responses.get(f"{status // 100}XX") or {}
    schema = documented.get("content", {}).get("application/json", {}).get("schema", {})
    shape = schema.get("$ref", "").removeprefix("#/components/schemas/")
    return shape if shape in ("Error", "AnthropicError") else None


def body_violates_document(path: str, method: str, body) -> bool:
    body_doc = _DOC["paths"][path][method.lower()].get("requestBody")
    if body_doc is None:
        return False
    schema = body_doc["content"]["application/json"]["schema"]
    return not jsonschema.Draft202012Validator({**schema, **_DOC}).is_valid(body)


def whole_floats_as_ints(value):
    """`2.0` spelled `2`. JSON Schema counts `2.0` as an integer, but the gateway's strict msgspec decoding refuses a
    number with a fraction or an exponent for an integer field (the document says so in words; JSON Schema cannot).
    Same value, so the case stays schema-valid; float fields accept `2` as well."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [whole_floats_as_ints(v) for v in value]
    if isinstance(value, dict):
        return {k: whole_floats_as_ints(v) for k, v in value.items()}
    return value


def check_error_shape(r) -> dict:
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "code", "param"}, err
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str)
    assert err["code"] is None or isinstance(err["code"], str)
    assert err["param"] is None or isinstance(err["param"], str)
    assert "Traceback" not in r.text
    return err


def check_anthropic_error_shape(r) -> None:
    body = r.json()
    assert set(body) == {"type", "error"} and body["type"] == "error", body
    assert set(body["error"]) == {"type", "message"} and body["error"]["message"], body
    assert "Traceback" not in r.text


def header(r, name: str) -> str:
    """schemathesis' Response keeps headers as lower-cased name -> list of values."""
    values = r.headers.get(name.lower()) or [""]
    return values[0]


def check_surface_stream(r) -> None:
    """Named events, each `event: NAME` then `data: {"type": NAME, ...}`, ending as a whole answer does."""
    events = []
    for block in filter(None, r.text.split("\n\n")):
        name, data = block.split("\n")
        assert name.startswith("event: ") and data.startswith("data: "), block[:300]
        assert msgspec.json.decode(data[6:])["type"] == name[7:]
        events.append(name[7:])
    assert events[-1] in ("message_stop", "response.completed", "response.incomplete"), events


def check_answer(path: str, r) -> None:
    ctype = header(r, "content-type")
    if path in SURFACES:
        if ctype.startswith("text/event-stream"):
            check_surface_stream(r)
        return  # a JSON answer: schemathesis checks it against the document's schema
    if ctype.startswith("text/event-stream"):
        events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
        assert events and events[-1] == "[DONE]", r.text[-300:]
        chunks = [msgspec.json.decode(e) for e in events[:-1]]
        assert not any("error" in c for c in chunks), chunks  # healthy backends: no mid-stream error
        assert all("choices" in c for c in chunks)
    else:
        body = r.json()
        assert body["choices"] and "usage" in body
    assert header(r, "x-request-id") and header(r, "x-tiergate-tier") in ("edge", "cloud", "cache")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda m: m.value)
@pytest.mark.parametrize("path, method", OPERATIONS, ids=[f"{m} {p}" for p, m in OPERATIONS])
def test_operation(gateway, edge_gateway, schema, path, method, mode):
    op = schema[path][method]
    has_input = bool(op.body) or any(True for _ in op.iter_parameters())
    if mode is GenerationMode.NEGATIVE and not has_input:
        pytest.skip("no inputs to violate")
    url = (edge_gateway if path.startswith("/edge/") else gateway)["gw"].url
    auth = credentials(path, method)
    statuses: Counter[int] = Counter()
    rejected_valid: Counter[str] = Counter()  # schema-valid bodies refused with 400, by `param`
    strategy = st.tuples(op.as_strategy(generation_mode=mode), st.sampled_from(MODELS),
                         st.sampled_from([True, True, True, False]))

    @settings(max_examples=EXAMPLES[method], deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(drawn=strategy)
    def run(drawn):
        case, model, with_key = drawn
        positive = mode is GenerationMode.POSITIVE
        if positive and isinstance(case.body, (dict, list)):
            case.body = whole_floats_as_ints(case.body)
        if positive and served(path) and model is not None and isinstance(case.body, dict):
            case.body["model"] = model  # still schema-valid: `model` is any string
        # Negative cases: half of them carry a valid key so that their bad bodies get past authentication;
        # such a case may no longer violate the schema (its violation may have been the header).
        headers = auth if positive or with_key else None
        mutated = not positive and with_key and auth is not None
        r = case.call(base_url=url, headers=headers, timeout=30)
        statuses[r.status_code] += 1
        assert r.status_code < 500, f"{r.status_code} from the gateway: {r.text[:500]}"
        if path in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
            assert r.status_code == 200
        elif r.status_code >= 400 and documented_error(path, method, r.status_code) == "AnthropicError":
            check_anthropic_error_shape(r)
        elif r.status_code >= 400 and documented_error(path, method, r.status_code):
            err = check_error_shape(r)
            if mode is GenerationMode.POSITIVE and r.status_code == 400:
                rejected_valid[str(err["param"])] += 1
        elif r.status_code == 200 and served(path):
            check_answer(path, r)
        if mutated and body_violates_document(path, method, case.body):
            assert r.status_code >= 400, f"accepted a body the document forbids: {case.body!r:.500}"
        excluded = [negative_data_rejection] if mutated else []
        if path in ("/admin/cache/invalidate", "/edge/v1/heartbeat"):
            excluded.append(positive_data_acceptance)
        if header(r, "content-type").startswith("text/event-stream"):
            excluded.append(response_schema_conformance)
        case.validate_response(r, headers=headers, excluded_checks=excluded)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # schemathesis' strategies trip a hypothesis deprecation warning
        run()
    print(f"{method} {path} {mode.value}: statuses {dict(sorted(statuses.items()))}; schema-valid but refused, "
          f"by param: {dict(rejected_valid)}")
    if served(path) and mode is GenerationMode.POSITIVE:
        assert statuses[200] > 0, statuses  # the fuzzing did reach dispatch, not only validation
    health = httpx.get(url + "/readyz", timeout=5)
    assert health.status_code == 200 and health.json()["ready"]


# ---- found by fuzzing, fixed (see docs/reliability.md, gaps 1 and 8) ------------------------------------------

def test_deeply_nested_json_is_a_400(gateway):
    deep = b'{"a":' * 20_000 + b"1" + b"}" * 20_000
    body = b'{"model":"auto","messages":[{"role":"user","content":"x"}],"response_format":' + deep + b"}"
    r = httpx.post(gateway["gw"].url + "/v1/chat/completions", content=body, timeout=30,
                   headers={**AUTH, "content-type": "application/json"})
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert check_error_shape(r)["code"] == "invalid_json"


REFUSED_AND_DOCUMENTED_INVALID = [
    ("ChatRequest", "/v1/chat/completions", {"model": "auto", "messages": []}),
    ("ChatRequest", "/v1/chat/completions", {"model": "auto", "messages": [{"role": "user"}], "max_tokens": 0}),
    ("ChatRequest", "/v1/chat/completions", {"model": "auto", "messages": [{"role": "user"}], "top_p": 0}),
    ("ChatRequest", "/v1/chat/completions", {"model": "auto", "messages": [{"role": "user"}], "n": 9}),
    ("ChatRequest", "/v1/chat/completions", {"model": "auto", "messages": [{"role": "user"}], "temperature": 3}),
    ("ChatRequest", "/v1/chat/completions",
     {"model": "auto", "messages": [{"role": "user"}], "max_tokens": 5, "max_completion_tokens": 0}),
    ("ChatRequest", "/v1/chat/completions", {"model": "auto", "messages": [{"role": "user"}], "top_p": 1.5}),
    ("ChatRequest", "/v1/chat/completions", {"model": "auto", "messages": [{"role": "user"}], "temperature": -1}),
    ("CompletionRequest", "/v1/completions", {"model": "auto", "prompt": ["a"] * 9}),
    ("CompletionRequest", "/v1/completions", {"model": "auto", "prompt": ["a", "b", "c"], "n": 3}),
    ("CompletionRequest", "/v1/completions", {"model": "auto", "prompt": [1, 2, 3]}),
    ("EmbeddingRequest", "/v1/embeddings", {"model": "tiergate-embed", "input": []}),
    ("EmbeddingRequest", "/v1/embeddings", {"model": "tiergate-embed", "input": [1, 2]}),
    ("EmbeddingRequest", "/v1/embeddings", {"model": "tiergate-embed", "input": "x", "encoding_format": "hex"}),
    ("CompletionRequest", "/v1/completions", {"model": "auto", "prompt": []}),
    ("CompletionRequest", "/v1/completions", {"model": "auto", "prompt": "a", "max_tokens": 0}),
    ("CompletionRequest", "/v1/completions", {"model": "auto", "prompt": "a", "n": 0}),
]


@pytest.mark.parametrize("name, path, body", REFUSED_AND_DOCUMENTED_INVALID)
def test_what_the_gateway_refuses_the_document_forbids(gateway, name, path, body):
    r = httpx.post(gateway["gw"].url + path, json=body, headers=AUTH, timeout=30)
    assert r.status_code == 400 and check_error_shape(r)["param"]
    validator = jsonschema.Draft202012Validator({"$ref": f"#/components/schemas/{name}", **_DOC})
    assert not validator.is_valid(body), f"{body} is valid per /openapi.json but the gateway answers 400"


# ---- found while documenting the edge routes (gap 9 in docs/reliability.md, fixed) ----

def test_heartbeat_with_integers_too_large_for_a_float_is_not_a_500(edge_gateway):
    body = b'{"node_id": "huge", "url": "http://127.0.0.1:1", "model": "m", "busy": 1' + b"0" * 400 + b"}"
    r = httpx.post(edge_gateway["gw"].url + "/edge/v1/heartbeat", content=body, timeout=30,
                   headers={**CREDENTIALS["edgeToken"], "content-type": "application/json"})
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert r.json()["error"]["type"] == "invalid_request_error"
