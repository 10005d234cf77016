"""`/v1/models`, `/v1/models/{id}`, the policy's `model_aliases` and CORS, through a real gateway."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import openai
import pytest

from tests.gateway.conftest import KEYS, write_policy
from tests.support.instant_upstream import HITS, make_app
from tests.support.servers import aiohttp_server, gateway_server
from tiergate.gateway.settings import Settings

AUTH = {"Authorization": "Bearer key-alpha-1"}
ALIASES = 'model_aliases:\n  gpt-4o-mini: auto\n  "claude-*": cloud\n  "gpt-*": edge\n'


@contextmanager
def aliased(tmp_path: Path, **settings: object) -> Iterator[dict]:
    with ExitStack() as es:
        edge = es.enter_context(aiohttp_server(make_app(4, model="edge-model")))
        cloud = es.enter_context(aiohttp_server(make_app(4, model="cloud-model")))
        pol = write_policy(tmp_path / "policy.yaml", [edge.url], [cloud.url])
        pol.write_text(pol.read_text() + ALIASES)
        gw = es.enter_context(gateway_server(Settings(policy=pol, embedder=None, redis_url=None, **settings),
                                             keyring=KEYS))
        yield {"gw": gw, "edge": edge, "cloud": cloud,
               "client": openai.OpenAI(base_url=gw.url + "/v1", api_key="key-alpha-1", max_retries=0)}


def test_models_are_retrieved_by_id_and_unknown_ids_are_openai_404s(tmp_path) -> None:
    with aliased(tmp_path) as s:
        client = s["client"]
        ids = [m.id for m in client.models.list()]
        assert ids == ["auto", "tiergate-edge", "tiergate-cloud", "gpt-4o-mini", "claude-*", "gpt-*"]
        edge = client.models.retrieve("tiergate-edge")
        assert edge.id == "tiergate-edge" and edge.owned_by == "tiergate" and edge.model_extra["tier"] == "edge"
        assert client.models.retrieve("auto").id == "auto"
        opus = client.models.retrieve("claude-opus-4-8")  # only a glob names it: it works, so it is retrievable
        assert (opus.id, opus.model_extra["alias_for"], opus.model_extra["alias_pattern"]) == (
            "claude-opus-4-8", "cloud", "claude-*")
        with pytest.raises(openai.NotFoundError) as err:
            client.models.retrieve("llama-7b")
        assert err.value.body["code"] == "model_not_found"
        r = httpx.get(s["gw"].url + "/v1/models/org/model-with-slash", headers=AUTH)
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        assert httpx.get(s["gw"].url + "/v1/models/auto").status_code == 401


def test_client_model_names_are_served_as_their_alias_says(tmp_path) -> None:
    with aliased(tmp_path) as s:
        client = s["client"]
        for model, tier, hits in (("claude-opus-4-8", "cloud", "cloud"), ("gpt-4o-mini", "edge", "edge"),
                                  ("gpt-4.1", "edge", "edge"), ("tiergate-cloud", "cloud", "cloud")):
            before = s[hits].app[HITS]
            raw = client.chat.completions.with_raw_response.create(
                model=model, messages=[{"role": "user", "content": f"hi {model}"}], max_tokens=2)
            assert raw.headers["x-tiergate-tier"] == tier, model
            assert s[hits].app[HITS] == before + 1
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="mistral-large", messages=[{"role": "user", "content": "x"}])


def test_messages_count_tokens_reads_client_model_names_as_their_alias_says(tmp_path) -> None:
    # As /v1/messages does: Claude Code and llama.cpp's own tests count tokens under their own model names.
    with aliased(tmp_path) as s:
        url, body = s["gw"].url + "/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "hi"}]}
        counts = [httpx.post(url, headers=AUTH, json={**body, "model": m}, timeout=10) for m in (
            "claude-opus-4-8", "gpt-4o-mini", "auto")]
        assert [r.status_code for r in counts] == [200, 200, 200], [r.text for r in counts]
        assert len({r.json()["input_tokens"] for r in counts}) == 1 and counts[0].json()["input_tokens"] > 0
        unknown = httpx.post(url, headers=AUTH, json={**body, "model": "mistral-large"}, timeout=10)
        assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "not_found_error"


def test_cors_is_off_by_default(tmp_path) -> None:
    with aliased(tmp_path) as s:
        r = httpx.options(s["gw"].url + "/v1/chat/completions", headers={
            "Origin": "https://app.example.com", "Access-Control-Request-Method": "POST"})
        assert r.status_code == 405 and "access-control-allow-origin" not in r.headers


def test_cors_preflight_and_headers_for_the_configured_origins_only(tmp_path) -> None:
    with aliased(tmp_path, cors_origins="https://app.example.com, http://localhost:3000") as s:
        url = s["gw"].url
        pre = httpx.options(url + "/v1/chat/completions", headers={
            "Origin": "https://app.example.com", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"})
        assert pre.status_code == 200
        assert pre.headers["access-control-allow-origin"] == "https://app.example.com"
        assert "POST" in pre.headers["access-control-allow-methods"]
        assert "x-stainless-os" in pre.headers["access-control-allow-headers"].lower()
        assert "access-control-allow-credentials" not in pre.headers
        denied = httpx.options(url + "/v1/chat/completions", headers={
            "Origin": "https://evil.example.com", "Access-Control-Request-Method": "POST"})
        assert denied.status_code == 400 and "access-control-allow-origin" not in denied.headers
        r = httpx.post(url + "/v1/chat/completions", headers=AUTH | {"Origin": "http://localhost:3000"},
                       json={"model": "auto", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:3000"
        assert "x-tiergate-tier" in r.headers["access-control-expose-headers"]
        other = httpx.get(url + "/v1/models", headers=AUTH | {"Origin": "https://evil.example.com"})
        assert other.status_code == 200 and "access-control-allow-origin" not in other.headers


@pytest.mark.parametrize("value", ["app.example.com", "https://a.example.com/path", "ftp://x", "https://a b"])
def test_cors_origins_that_are_not_origins_are_refused(value) -> None:
    with pytest.raises(ValueError, match="TIERGATE_CORS_ORIGINS"):
        Settings(cors_origins=value)


def test_cors_origins_parse() -> None:
    assert Settings(cors_origins=" https://a.example.com ,http://[::1]:8080,").cors_origin_list() == [
        "https://a.example.com", "http://[::1]:8080"]
    assert Settings(cors_origins="").cors_origin_list() == [] == Settings().cors_origin_list()
    assert Settings(cors_origins="*").cors_origin_list() == ["*"]
