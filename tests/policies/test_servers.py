"""policies/servers: each static endpoint's real context size (`max_model_len` in its /v1/models), read in
parallel and compared with the tier's `max_context`; a server that cannot be read is a note, never a failure.

The servers are real HTTP servers on loopback ports answering the way vLLM and `edge-node serve` do.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from aiohttp import web

from tests.support.ports import free_port
from tests.support.servers import aiohttp_server
from tiergate.policies.loader import parse_policy
from tiergate.policies.servers import ServerContext, read_contexts


@contextmanager
def models_servers(*answers: object) -> Iterator[list[str]]:
    """One server per answer: a JSON body for /v1/models, or an int status to fail with."""
    with ExitStack() as stack:
        urls = []
        for answer in answers:
            async def models(_request: web.Request, answer: object = answer) -> web.Response:
                if isinstance(answer, int):
                    return web.Response(status=answer)
                if isinstance(answer, str):
                    return web.Response(text=answer)
                return web.json_response(answer)

            app = web.Application()
            app.router.add_get("/v1/models", models)
            urls.append(stack.enter_context(aiohttp_server(app)).url)
        yield urls


def _listing(*entries: tuple[str, int]) -> dict:
    return {"object": "list", "data": [{"id": i, "object": "model", "max_model_len": n} for i, n in entries]}


def _policy(edge: list[str], cloud: list[str], served: str = "") -> str:
    return f"""\
version: 1
tiers:
  edge: {{kind: edge, model: m-edge, max_context: 4096, endpoints: {edge}}}
  cloud: {{kind: cloud, model: m-cloud, {served} max_context: 8192, endpoints: {cloud}}}
rules:
  - {{name: default, tier: edge, fallbacks: [cloud]}}
"""


def test_each_endpoint_is_compared_with_its_tiers_max_context_in_policy_order() -> None:
    with models_servers(_listing(("m-edge", 4096)), _listing(("m-cloud", 2048)), _listing(("m-cloud", 32768))) \
            as (edge, small, big):
        got = read_contexts(parse_policy(_policy([edge], [small, big])))
    assert [(s.tier, s.endpoint, s.max_context, s.context, s.too_small) for s in got] == [
        ("edge", edge, 4096, 4096, False), ("cloud", small, 8192, 2048, True), ("cloud", big, 8192, 32768, False)]
    assert got[1].describe() == (
        f"warning: tier `cloud`: max_context 8192 is larger than the 2048 tokens {small} serves (max_model_len in "
        "its /v1/models): prompts the policy sends there may be refused with context_length_exceeded")
    assert got[0].describe() == f"ok: tier `edge`: {edge} serves 4096 tokens (max_context 4096)"


def test_the_entry_for_the_served_model_counts_else_the_first() -> None:
    """vLLM may serve several models; an edge node lists only its own, under its own name."""
    listing = _listing(("other", 1024), ("served-name", 16384))
    with models_servers(listing, _listing(("edge-a", 4096))) as (cloud, edge):
        by_tier = {s.tier: s for s in read_contexts(parse_policy(_policy([edge], [cloud], "served_model: served-name,")))}
        assert by_tier["cloud"].context == 16384 and by_tier["edge"].context == 4096
        (unnamed,) = [s for s in read_contexts(parse_policy(_policy([], [cloud])))]
        assert unnamed.context == 1024  # m-cloud is not listed: the first entry


def test_a_server_that_cannot_be_read_is_a_note_with_the_reason() -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    with models_servers(500, {"data": [{"id": "m-cloud"}]}, "not json", {"data": "oops"}) as urls:
        got = read_contexts(parse_policy(_policy([closed], urls)), timeout_s=5)
    assert all(s.context is None and not s.too_small for s in got)
    errors = [s.error or "" for s in got]
    assert errors[0].startswith("URLError") and "refused" in errors[0].lower()  # nothing listening
    assert errors[1].startswith("HTTPError") and "500" in errors[1]
    assert errors[2] == "ValueError: /v1/models gives no max_model_len"
    assert errors[3].startswith("JSONDecodeError")
    assert errors[4] == "ValueError: /v1/models gives no max_model_len"  # `data` is not a list of models
    assert got[0].describe() == (f"note: tier `edge`: could not read the context of {closed} ({errors[0]}); "
                                 "not checked")


def test_a_policy_without_static_endpoints_reads_nothing() -> None:
    """Edge nodes that register themselves are checked by the gateway when they register, not here."""
    edge_registers = _policy([], [])  # the edge tier lists no endpoints: its nodes register themselves
    cloud_discovered = edge_registers.replace("max_context: 8192, endpoints: []", "max_context: 8192, "
                                              "discovery: {dns: vllm.local, port: 8000}")
    assert read_contexts(parse_policy(cloud_discovered)) == []


def test_a_context_not_read_is_never_too_small() -> None:
    assert not ServerContext("t", "http://x", 4096, None, "timed out").too_small
    assert ServerContext("t", "http://x", 4096, 4095).too_small and not ServerContext("t", "http://x", 4096, 4096).too_small


def test_a_tiers_key_is_presented_when_its_environment_has_it(monkeypatch) -> None:
    seen: list[str | None] = []

    async def models(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        if request.headers.get("Authorization") != "Bearer vllm-key-0123":
            return web.json_response({"error": "Unauthorized"}, status=401)
        return web.json_response(_listing(("m-cloud", 8192)))

    app = web.Application()
    app.router.add_get("/v1/models", models)
    with aiohttp_server(app) as server:
        policy = parse_policy(_policy([], [server.url]).replace("max_context: 8192,",
                                                                 "max_context: 8192, api_key_env: VLLM_KEY,"))
        monkeypatch.delenv("VLLM_KEY", raising=False)
        (without,) = read_contexts(policy)
        monkeypatch.setenv("VLLM_KEY", "vllm-key-0123")
        (with_key,) = read_contexts(policy)
    assert without.error is not None and "401" in without.error
    assert with_key.context == 8192 and seen == [None, "Bearer vllm-key-0123"]
