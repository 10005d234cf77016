"""Byte-level fuzz cases for every HTTP surface: valid requests, then mutated at the byte level.

A case is one whole HTTP/1.1 request (method, path, raw header lines, raw body) built from a seed request of its
surface by one mutator, drawn from a `random.Random(seed)`: the same seed gives the same cases, byte for byte.
Mutators: invalid UTF-8 inside a string, lone surrogates (escaped and raw), truncation, deep nesting, huge and
tiny numbers, NaN/Infinity, duplicate keys, wrong types, control characters, BOM and UTF-16, byte flips, random
bytes, wrong content types, odd headers (non-ASCII, huge, duplicated, chunked bodies).

Surfaces (each a list of seed requests):
- `gateway-api`: /v1/chat/completions and /v1/completions (JSON and streaming), /v1/models;
- `gateway-surfaces`: /v1/messages (JSON and streaming, tools, tool results; `x-api-key` or a bearer key),
  /v1/messages/count_tokens, /v1/responses (JSON and streaming, items with calls and their outputs);
- `gateway-admin`: /admin/policy/reload, /admin/cache/invalidate, /dashboard/data, /metrics, /readyz;
- `edge-registration`: /edge/v1/heartbeat, /edge/v1/deregister (on a gateway of their own: see bench/fuzz);
- `edge-node`: an edge node's /v1/chat/completions, /v1/completions, /v1/models, /health.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from tiergate.core.edge_identity import CLAIM_HEADER

__all__ = ["MUTATORS", "SURFACES", "Case", "Target", "generate"]


@dataclass(frozen=True, slots=True)
class Target:
    """What a surface's requests need: credentials and the URL a heartbeat may name (a harmless backend)."""

    api_key: str = ""
    admin_key: str = ""
    edge_token: str = ""
    node_url: str = "http://127.0.0.1:9"


@dataclass(frozen=True, slots=True)
class Case:
    surface: str
    mutator: str
    method: str
    path: str
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    chunked: bool = False  # send the body with Transfer-Encoding: chunked

    def describe(self) -> str:
        return f"{self.surface}/{self.mutator} {self.method} {self.path} body[{len(self.body)}]={self.body[:120]!r}"


@dataclass(slots=True)
class _Seed:
    method: str
    path: str
    body: object | None  # a JSON value, or None for no body
    auth: str  # which credential: api, admin, edge, none
    headers: dict[str, str] = field(default_factory=dict)


def _sampling(rng: random.Random) -> dict[str, object]:
    """Sampling parameters as a hostile tenant sends them: in range, at the edges, far out of range; the mutators
    then turn some into huge numbers, NaN, Infinity or the wrong type. One request of this kind once killed every
    node it reached (logit_bias 1e39 under a json_object grammar)."""
    edge = [-1e39, -101, -100, -2.5, -0.0, 0, 1e-9, 0.5, 1, 2, 2.0001, 100, 101, 1e39]
    fields = {"temperature": edge, "top_p": edge, "presence_penalty": edge, "frequency_penalty": edge,
              "min_p": edge, "repetition_penalty": edge, "top_k": [-1, 0, 1, 40, 1 << 31, 1 << 63],
              "seed": [-1, 0, 7, 1 << 63], "top_logprobs": [-1, 0, 5, 20, 21],
              "logit_bias": [{"0": 1e39, "1": 1e39}, {"0": 100, "1": -100}, {"999999999": 5}, {"x": 1}, {"0": 101}],
              "response_format": [{"type": "json_object"}, {"type": "text"}, {"type": "nope"}]}
    picked = rng.sample(sorted(fields), rng.randint(1, 4))
    return {name: rng.choice(fields[name]) for name in picked}


def _seeds(surface: str, t: Target, rng: random.Random) -> list[_Seed]:
    words = ["hello", "river", "stone", "prove", "step by step", "é", "🙂", "日本"]
    text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 12)))
    if surface == "gateway-api":
        chat = {"model": rng.choice(["auto", "tiergate-edge", "tiergate-cloud"]),
                "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}],
                "max_tokens": rng.randint(1, 8), "temperature": rng.choice([0, 0.5, 1])}
        if rng.random() < 0.5:
            chat |= {"stream": True, "stream_options": {"include_usage": rng.random() < 0.5}}
        if rng.random() < 0.2:
            chat["tools"] = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
        if rng.random() < 0.3:
            chat |= _sampling(rng)
        comp: dict[str, object] = {"model": "auto", "prompt": text, "max_tokens": rng.randint(1, 8),
                                   "stream": rng.random() < 0.5}
        if rng.random() < 0.3:  # several answers: each becomes a request of its own (gateway.fanout)
            chat["n"] = comp["n"] = rng.choice([2, 3, 8, 0, -1, 9, 1 << 63, 2.0, True])
        if rng.random() < 0.3:  # prompt lists: texts, token ids, nested, empty, over the limit
            comp["prompt"] = rng.choice([[text, "second"], [text] * rng.randint(2, 12), [], [1, 2, 3], [[1], [2]],
                                         [text, 5], [""], [text, None]])
        embed = {"model": rng.choice(["tiergate-embed", "text-embedding-3-small"]),
                 "input": rng.choice([text, [text, "second"], [], [1, 2], [text] * 300, "", [text, ""]]),
                 **rng.choice([{}, {"encoding_format": "base64"}, {"encoding_format": "hex"}, {"dimensions": 384},
                               {"dimensions": -1}])}
        model = rng.choice(["auto", "tiergate-edge", "claude-opus-4-8", "org/model", "%00", "..", "x" * 300])
        return [_Seed("POST", "/v1/chat/completions", chat, "api"), _Seed("POST", "/v1/completions", comp, "api"),
                _Seed("GET", "/v1/models", None, "api"), _Seed("POST", "/v1/embeddings", embed, "api"),
                _Seed("GET", f"/v1/models/{model}", None, "api")]
    if surface == "gateway-surfaces":
        return _surface_seeds(t, rng, text)
    if surface == "gateway-admin":
        return [_Seed("POST", "/admin/policy/reload", None, "admin"),
                _Seed("POST", rng.choice(["/admin/cache/invalidate?all=true", "/admin/cache/invalidate?tenant=t",
                                          "/admin/cache/invalidate?entry=e1"]), None, "admin"),
                _Seed("GET", "/dashboard/data", None, "admin"), _Seed("GET", "/readyz", None, "none"),
                _Seed("GET", "/metrics", None, "none"),
                _Seed("POST", rng.choice(["/admin/keys/revoke", "/admin/keys/unrevoke"]),
                      rng.choice([{"sha256": "0" * 64}, {"key": "not-a-tenant-key"}, {"sha256": "xyz"}]), "admin")]
    if surface == "edge-registration":
        node = f"fuzz-{rng.randrange(1 << 30):x}"
        beat = {"node_id": node, "url": t.node_url, "model": "fuzz-model", "slots": rng.randint(1, 8),
                "busy": rng.randint(0, 4), "queued": rng.randint(0, 4), "ctx": rng.choice([0, 512, 2048])}
        claim = {CLAIM_HEADER: "fuzz-node-claim-000001"}  # the node's claim: the id is bound to it
        return [_Seed("POST", "/edge/v1/heartbeat", beat, "edge", claim),
                _Seed("POST", "/edge/v1/deregister", {"node_id": node}, "edge", claim)]
    if surface == "edge-node":
        chat = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": rng.randint(1, 6),
                "temperature": rng.choice([0, 0.8]), "stream": rng.random() < 0.5}
        if rng.random() < 0.3:
            chat |= _sampling(rng)
        comp = {"model": "m", "prompt": text, "max_tokens": rng.randint(1, 6), "stream": rng.random() < 0.5}
        return [_Seed("POST", "/v1/chat/completions", chat, "none"), _Seed("POST", "/v1/completions", comp, "none"),
                _Seed("GET", "/v1/models", None, "none"), _Seed("GET", "/health", None, "none")]
    raise ValueError(f"unknown surface {surface!r}; known: {', '.join(SURFACES)}")


def _surface_seeds(t: Target, rng: random.Random, text: str) -> list[_Seed]:
    """Anthropic Messages and OpenAI Responses requests, translated by the gateway into chat requests."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    messages: dict[str, object] = {
        "model": rng.choice(["auto", "tiergate-edge", "claude-opus-4-8"]), "max_tokens": rng.randint(1, 8),
        "system": rng.choice(["Be brief.", [{"type": "text", "text": "Be brief."}]]),
        "messages": [{"role": "user", "content": text}]}
    if rng.random() < 0.4:
        messages["tools"] = [{"name": "w", "input_schema": schema}]
        messages["tool_choice"] = rng.choice([{"type": "auto"}, {"type": "any"}, {"type": "tool", "name": "w"}])
        messages["messages"] = [
            {"role": "user", "content": text},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "w", "input": {"city": "x"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": text}]}]
    if rng.random() < 0.5:
        messages["stream"] = True
    if rng.random() < 0.3:
        messages |= {k: v for k, v in _sampling(rng).items() if k in ("temperature", "top_p", "top_k")}
    key = {"x-api-key": t.api_key} if rng.random() < 0.5 else {}
    responses: dict[str, object] = {"model": rng.choice(["auto", "tiergate-cloud"]), "input": text,
                                    "max_output_tokens": rng.randint(1, 8), "stream": rng.random() < 0.5}
    if rng.random() < 0.4:
        responses["tools"] = [{"type": "function", "name": "w", "parameters": schema}]
        responses["input"] = [{"role": "user", "content": text},
                              {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
                              {"type": "function_call_output", "call_id": "c1", "output": text}]
    if rng.random() < 0.2:
        responses["text"] = {"format": {"type": "json_schema", "name": "a", "schema": schema}}
    count = {"model": "auto", "messages": [{"role": "user", "content": text}]}
    return [_Seed("POST", "/v1/messages", messages, "none" if key else "api", key),
            _Seed("POST", "/v1/messages/count_tokens", count, "api"),
            _Seed("POST", "/v1/responses", responses, "api")]


SURFACES = ("gateway-api", "gateway-surfaces", "gateway-admin", "edge-registration", "edge-node")

# ---- how a JSON value is spelled with one raw fragment in it ------------------------------------------------

_HOLE = "\x00HOLE\x00"


def _paths(value: object, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value inside a JSON document (the root excluded)."""
    out: list[tuple] = []
    if isinstance(value, dict):
        for k, v in value.items():
            out.append((*prefix, k))
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.append((*prefix, i))
            out += _paths(v, (*prefix, i))
    return out


def _with_hole(doc: object, path: tuple) -> object:
    """A deep copy of `doc` whose value at `path` is the placeholder."""
    doc = json.loads(json.dumps(doc))
    node = doc
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = _HOLE
    return doc


def _dump(doc: object) -> bytes:
    return json.dumps(doc, ensure_ascii=False).encode()


def _splice(doc: object, rng: random.Random, fragment: bytes, want: type | None = None) -> bytes:
    """The document with the value at a random path (of type `want`, when there is one) spelled as `fragment`."""
    paths = _paths(doc)
    if want is not None:
        typed = [p for p in paths if isinstance(_get(doc, p), want) and not isinstance(_get(doc, p), bool)]
        paths = typed or paths
    if not paths:
        return fragment
    holed = _dump(_with_hole(doc, rng.choice(paths)))
    return holed.replace(json.dumps(_HOLE).encode(), fragment, 1)


def _get(doc: object, path: tuple) -> object:
    for p in path:
        doc = doc[p]  # type: ignore[index]
    return doc


def _in_string(doc: object, rng: random.Random, raw: bytes) -> bytes:
    """`raw` bytes inside one of the document's strings (a new field when it has none)."""
    paths = [p for p in _paths(doc) if isinstance(_get(doc, p), str)]
    if not paths:
        if isinstance(doc, dict):
            return _dump(doc)[:-1] + (b"," if doc else b"") + b'"x":"' + raw + b'"}'
        return b'"' + raw + b'"'
    path = rng.choice(paths)
    s = _get(doc, path)
    assert isinstance(s, str)
    cut = rng.randint(0, len(s))
    left = json.dumps(s[:cut], ensure_ascii=False).encode()[:-1]  # the opening quote and the text, escaped
    right = json.dumps(s[cut:], ensure_ascii=False).encode()[1:]  # the rest of the text and the closing quote
    return _dump(_with_hole(doc, path)).replace(json.dumps(_HOLE).encode(), left + raw + right, 1)


# ---- mutators: (seed body, rng) -> (body, extra headers, chunked) -------------------------------------------

Mutated = tuple[bytes, dict[str, bytes], bool]
_INVALID_UTF8 = [b"\xff", b"\xfe", b"\xff\xfe", b"\xc0\xaf", b"\xc3\x28", b"\xed\xa0\x80", b"\xed\xbf\xbf",
                 b"\xf4\x90\x80\x80", b"\xe2\x82", b"\x80", b"\xf0\x9f\x99", b"\xf8\x88\x80\x80\x80"]
_SURROGATES = [b"\\ud800", b"\\udfff", b"\\ud83d", b"\\ud83dx", b"\\udc00\\ud800", b"\\ud800\\u0041"]
_NUMBERS = [b"1e999", b"-1e999", b"1" + b"0" * 400, b"-" + b"9" * 400, b"1e-400", b"-0", b"0.0", b"-0.0",
            b"9223372036854775808", b"-9223372036854775809", b"18446744073709551616", b"1.7976931348623157e309",
            b"4.9e-325", b"1E+2", b"0e0", b"1.5", b"2.0", b"-1", b"0", b"2147483648", b"1e308", b"123456789" * 30]
_NON_JSON_NUMBERS = [b"NaN", b"Infinity", b"-Infinity", b"+1", b"01", b".5", b"1.", b"0x10", b"1e", b"--1", b"nan"]
_CONTROL = [b"\x00", b"\x01", b"\x1f", b"\x7f", b"\n", b"\t", b"\r\n", b"\\u0000", b"\\u001f", b"\\x00", b"\\",
            b"\\q", b"\\u12", b"\\u"]
_VALUES = [b"null", b"true", b"false", b"0", b"-1", b'""', b"[]", b"{}", b'"x"', b"[null]", b'{"": null}', b"[[]]",
           b'{"role":"user"}', b'[{"role":"user","content":"x"}]', b'"' + b"a" * 100_000 + b'"']


def _invalid_utf8(doc, rng) -> Mutated:
    return _in_string(doc, rng, rng.choice(_INVALID_UTF8)), {}, False


def _lone_surrogate(doc, rng) -> Mutated:
    return _in_string(doc, rng, rng.choice(_SURROGATES)), {}, False


def _truncated(doc, rng) -> Mutated:
    body = _dump(doc)
    return body[:rng.randrange(len(body))], {}, False


def _deep(doc, rng) -> Mutated:
    depth = rng.choice([64, 512, 4096, 50_000, 200_000])
    opener, closer = rng.choice([(b"[", b"]"), (b'{"a":', b"}")])
    inner = opener * depth + b"1" + closer * depth
    if rng.random() < 0.2:
        inner = opener * depth  # never closed
    return _splice(doc, rng, inner), {}, False


def _huge_number(doc, rng) -> Mutated:
    return _splice(doc, rng, rng.choice(_NUMBERS), want=(int, float)), {}, False


def _nan_infinity(doc, rng) -> Mutated:
    return _splice(doc, rng, rng.choice(_NON_JSON_NUMBERS), want=(int, float)), {}, False


def _duplicate_keys(doc, rng) -> Mutated:
    body = _dump(doc)
    if not isinstance(doc, dict) or not doc:
        return body + body, {}, False
    key = rng.choice(list(doc))
    other = rng.choice(_VALUES[:-1] + [json.dumps(doc[key], ensure_ascii=False).encode()])
    extra = json.dumps(key).encode() + b":" + other
    return (b"{" + extra + b"," + body[1:]) if rng.random() < 0.5 else (body[:-1] + b"," + extra + b"}"), {}, False


def _wrong_type(doc, rng) -> Mutated:
    return _splice(doc, rng, rng.choice(_VALUES)), {}, False


def _control(doc, rng) -> Mutated:
    return _in_string(doc, rng, rng.choice(_CONTROL)), {}, False


def _encoding(doc, rng) -> Mutated:
    text = json.dumps(doc, ensure_ascii=False)
    codec = rng.choice(["utf-8-sig", "utf-16", "utf-16-le", "utf-32", "latin-1", "cp1252"])
    body = text.encode(codec, errors="replace")
    return body, ({"content-type": b"application/json; charset=" + codec.encode()} if rng.random() < 0.5 else {}), False


def _byte_flip(doc, rng) -> Mutated:
    body = bytearray(_dump(doc))
    for _ in range(rng.randint(1, 8)):
        if body:
            body[rng.randrange(len(body))] = rng.randrange(256)
    return bytes(body), {}, False


def _random_bytes(doc, rng) -> Mutated:
    n = rng.choice([0, 1, 2, 16, 300, 5000])
    return bytes(rng.randrange(256) for _ in range(n)), {}, False


def _top_level(doc, rng) -> Mutated:
    return rng.choice([b"", b" ", b"\n", b"null", b"[]", b"{}", b'"x"', b"0", b"[" + _dump(doc) + b"]", b"{{}",
                       _dump(doc) + b"garbage", _dump(doc) + b" " + _dump(doc)]), {}, False


def _content_type(doc, rng) -> Mutated:
    ctype = rng.choice([b"text/plain", b"application/x-www-form-urlencoded", b"multipart/form-data; boundary=x",
                        b"application/xml", b"application/json; charset=utf-16", b"application/json; charset=bogus",
                        b"", b";;;", b"application/json\x01", b"*/*"])
    return _dump(doc), {"content-type": ctype}, False


def _odd_headers(doc, rng) -> Mutated:
    body = _dump(doc)
    pick = rng.randrange(9)
    if pick == 0:
        return body, {"authorization": b"Bearer \xe9\xff\xfe"}, False
    if pick == 1:
        return body, {"authorization": b"Bearer " + b"k" * rng.choice([200, 8000])}, False
    if pick == 2:
        return body, {"x-request-id": rng.choice([b"\xff\xfe", b"r" * 4000, b"", b"\t id \t"])}, False
    if pick == 3:
        return body, {"x-tiergate-priority": rng.choice([b"urgent", b"\xff", b"99", b"-1", b"HIGH", b""])}, False
    if pick == 4:
        return body, {}, True  # chunked transfer encoding
    if pick == 5:
        return body, {"accept-encoding": b"gzip, br, zstd, \xff", "accept": b"text/event-stream, */*;q=\xff"}, False
    if pick == 6:
        return body, {"expect": b"100-continue"}, False
    if pick == 7:
        return body, {"authorization": b"Basic dXNlcjpwYXNz"}, False
    return body, {"content-length": str(len(body) - rng.randint(1, max(1, len(body) - 1))).encode()}, False


_QUERIES = [b"?tenant=%ff%fe", b"?entry=%00", b"?all=%", b"?all=%zz", b"?key=" + b"k" * 3000, b"?a=1&a=2&a=3",
            b"?tenant=&entry=&all=", b"?" + b"&".join(b"p%d=1" % i for i in range(300)), b"?x=%ed%a0%80",
            b"?\xff", b"#frag", b"/", b"//", b"/..", b"%2F", b";jsessionid=1"]


def _path_query(doc, rng) -> Mutated:
    """The path is mutated instead (see `generate`): the body stays the seed's."""
    return _dump(doc), {}, False


MUTATORS: dict[str, Callable[[object, random.Random], Mutated]] = {
    "valid": lambda doc, rng: (_dump(doc), {}, False),
    "invalid_utf8": _invalid_utf8, "lone_surrogate": _lone_surrogate, "truncated": _truncated,
    "deep_nesting": _deep, "huge_number": _huge_number, "nan_infinity": _nan_infinity,
    "duplicate_keys": _duplicate_keys, "wrong_type": _wrong_type, "control_chars": _control,
    "encoding": _encoding, "byte_flip": _byte_flip, "random_bytes": _random_bytes, "top_level": _top_level,
    "content_type": _content_type, "odd_headers": _odd_headers, "path_query": _path_query,
}


def _credential(auth: str, t: Target) -> bytes | None:
    key = {"api": t.api_key, "admin": t.admin_key, "edge": t.edge_token}.get(auth)
    return f"Bearer {key}".encode() if key else None


def generate(surface: str, target: Target, seed: int, n: int) -> list[Case]:
    """`n` cases for `surface`, the same for the same seed: every mutator in turn, on a random seed request."""
    rng = random.Random(f"{surface}:{seed}")
    names = list(MUTATORS)
    cases = []
    for i in range(n):
        mutator = names[i % len(names)]
        seed_req = rng.choice(_seeds(surface, target, rng))
        doc = seed_req.body if seed_req.body is not None else {}
        body, headers, chunked = MUTATORS[mutator](doc, rng)
        path = seed_req.path
        if seed_req.body is None and mutator in ("valid", "odd_headers", "path_query"):
            body = b""
        if mutator == "path_query":
            path = (path + rng.choice(_QUERIES).decode("latin-1")) if "?" not in path or rng.random() < 0.5 else \
                path.split("?")[0] + rng.choice(_QUERIES).decode("latin-1")
        hdrs: dict[str, bytes] = {"content-type": b"application/json"}
        if (cred := _credential(seed_req.auth, target)) is not None:
            hdrs["authorization"] = cred
        hdrs.update((k, v.encode()) for k, v in seed_req.headers.items())
        hdrs.update(headers)
        ordered = [(k.encode(), v) for k, v in hdrs.items()]
        if mutator == "odd_headers" and rng.random() < 0.3 and cred is not None:
            ordered.append((b"authorization", b"Bearer wrong"))  # a second Authorization header
        cases.append(Case(surface, mutator, seed_req.method, path, tuple(ordered), body, chunked))
    return cases
