"""`gateway.context`: what a request carries. Here: its id, which is the client's `x-request-id` only when that is
short and plain (`safe_request_id`); the rest of the module is exercised through test_settlement.py and
test_app.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from tests.gateway.conftest import write_policy
from tests.support.instant_upstream import make_app
from tests.support.servers import aiohttp_server, free_port
from tests.support.waiting import wait_until
from tiergate.gateway.context import MAX_REQUEST_ID, Arrival, safe_request_id

FRESH = re.compile(r"[0-9a-f]{32}")


@pytest.mark.parametrize("given", [
    "req-abc-123", "0b4c1f6e-8f7e-4f57-9d3e-2a9a3c2b1e55", "01HZY3X8Q4M6W9K2V5T7R1N0PB", "dGVzdA+/==",
    "trace:span.1_2", "x" * MAX_REQUEST_ID,
])
def test_a_short_plain_client_id_is_kept(given: str) -> None:
    assert safe_request_id(given) == given
    assert Arrival.now(given, "chat").request_id == given


@pytest.mark.parametrize("given", [
    None, "", "x" * (MAX_REQUEST_ID + 1), "r" * 30_000, "has space", 'quo"te', "new\nline", "tab\t",
    "{\"json\": 1}", "caf\u00e9", "semi;colon", "a,b", "<script>",
])
def test_any_other_client_id_is_replaced_by_a_fresh_one(given: str | None) -> None:
    first, second = safe_request_id(given), safe_request_id(given)
    assert FRESH.fullmatch(first) and FRESH.fullmatch(second) and first != second
    assert FRESH.fullmatch(Arrival.now(given, "completions").request_id)


def test_a_real_gateway_echoes_forwards_and_logs_only_a_safe_id(tmp_path: Path) -> None:
    """`tiergate serve` with JSON logs at info: a 30 KB `x-request-id` (and one with a space and a quote) is
    neither echoed, nor sent to the backend, nor logged; the request gets a fresh id, the same in all three
    places. A plain id is kept in all three."""
    seen: list[str | None] = []

    @web.middleware
    async def record(request: web.Request, handler):  # type: ignore[no-untyped-def]
        if request.path.startswith("/v1/"):
            seen.append(request.headers.get("x-request-id"))
        return await handler(request)

    edge_app = make_app(2, model="edge-model")
    edge_app.middlewares.append(record)
    with aiohttp_server(edge_app) as edge, aiohttp_server(make_app(2, model="cloud-model")) as cloud:
        policy = write_policy(tmp_path / "policy.yaml", [edge.url], [cloud.url], cache=False)
        port = free_port()
        env = os.environ | {"TIERGATE_POLICY": str(policy), "TIERGATE_PORT": str(port), "TIERGATE_HOST": "127.0.0.1",
                            "TIERGATE_API_KEYS": "rid-key-1=alpha", "TIERGATE_EMBEDDER": "", "TIERGATE_REDIS_URL": "",
                            "TIERGATE_LOG_FORMAT": "json", "TIERGATE_LOG_LEVEL": "info"}
        log_path = tmp_path / "gw.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "tiergate.gateway.cli", "serve"], env=env, stdout=log,
                                    stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_until(lambda: _status(base + "/readyz") == 200, timeout_s=60, what="gateway ready")
            answered = {}
            for given in ("r" * 30_000, 'bad id"', "req-plain-7"):
                r = httpx.post(base + "/v1/chat/completions", timeout=30,
                               headers={"Authorization": "Bearer rid-key-1", "x-request-id": given},
                               json={"model": "auto", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
                assert r.status_code == 200, r.text
                answered[given] = r.headers["x-request-id"]
            ids = list(answered.values())
            wait_until(lambda: all(i in log_path.read_text() for i in ids), timeout_s=30,
                       what="each request's log line")
        finally:
            proc.terminate()
            proc.wait(30)
    long_id, quoted_id, plain_id = ids
    assert FRESH.fullmatch(long_id) and FRESH.fullmatch(quoted_id) and plain_id == "req-plain-7"
    assert seen == ids  # what the backend was sent
    text = log_path.read_text()
    assert "rrrrrrrr" not in text and 'bad id' not in text
    logged = [json.loads(line)["request_id"] for line in text.splitlines()
              if line.startswith("{") and json.loads(line).get("event") == "request"]
    assert logged == ids


def _status(url: str) -> int:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return 0
