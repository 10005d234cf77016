"""First token means a token: a backend that opened its stream with a role-only frame and then hangs, dies or
fails has not begun the answer, so the request is retried elsewhere (docs/architecture.md, "Failure handling").

The backends here open their chat streams the way vLLM and llama.cpp servers do: a role-only frame as soon as
they accept the request, before it has a slot or its prefill (`tests/support/instant_upstream.py`, the `role_*` modes).
"""

from __future__ import annotations

import threading

import httpx
import msgspec
import pytest

from tests.gateway.conftest import stack
from tests.support.edge import parse_metrics
from tests.support.instant_upstream import GATE, HITS, OPENED

AUTH = {"Authorization": "Bearer key-alpha-1"}
STREAM = {"model": "auto", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4, "temperature": 1,
          "stream": True}


def _stream(url: str) -> list[dict | str]:
    with httpx.stream("POST", url + "/v1/chat/completions", json=STREAM, headers=AUTH, timeout=60) as r:
        assert r.status_code == 200, r.read()
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    return [e if e == "[DONE]" else msgspec.json.decode(e) for e in events]


@pytest.mark.parametrize("mode", ["role_hang", "role_cut", "role_error"])
def test_a_backend_that_fails_after_its_role_frame_is_retried_on_another(tmp_path, mode):
    # role_hang: queued for ever (first-byte time 1 s); role_cut: died with the request queued; role_error: its
    # engine failed before the request's first token. No fallback tier: the other edge endpoint must answer.
    with stack(tmp_path, edge_modes=(mode, "ok"), policy={"fallback": False, "first_byte_s": 1.0}) as s:
        bad = s["edges"][0].app
        answers = [_stream(s["gw"].url) for _ in range(4)]
        assert bad[HITS] >= 1  # the failing backend did get requests (least loaded, round robin)
    for events in answers:
        assert events[-1] == "[DONE]" and not any("error" in e for e in events[:-1]), events
        assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1]) == "w0 w1 w2 w3 "


def test_the_role_frame_reaches_the_client_with_the_first_token_and_ttft_counts_from_it(tmp_path):
    with stack(tmp_path, edge_modes=("role_gated",), policy={"fallback": False}) as s:
        app, url = s["edges"][0].app, s["gw"].url
        got: dict[str, object] = {}
        client = threading.Thread(target=lambda: got.update(events=_stream(url)))
        client.start()
        assert app[OPENED].wait(30)  # the backend sent its role frame and now waits for the gate
        app[GATE].set()
        client.join(60)
        metrics = parse_metrics(httpx.get(url + "/metrics", timeout=10).text)
    events = got["events"]
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}  # held, then relayed as sent
    assert events[1]["choices"][0]["delta"]["content"] == "w0 "
    assert metrics[("tiergate_time_to_first_token_seconds_count", (("tier", "edge"),))] == 1
