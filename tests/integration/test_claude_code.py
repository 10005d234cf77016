"""Claude Code (the npm package, pinned in tests/clients/package.json) pointed at the gateway with
`ANTHROPIC_BASE_URL`: one non-interactive request (`claude -p`, no built-in tools) goes end to end through
`/v1/messages` to a real SmolLM2-135M-Instruct edge node.

Claude Code names its own model (`claude-…`), so the policy maps `claude-*` to the edge tier (`model_aliases`); it
asks for 64,000 output tokens unless told otherwise, more than the edge's whole context, so the run sets
`CLAUDE_CODE_MAX_OUTPUT_TOKENS` as an operator of a small tier would. Its system prompt with no tools is about
1,700 tokens and fits the node's 4,096. What the 135M model answers is not judged: the test checks that Claude
Code got complete answers (exit 0 with the text printed, or, when the model sampled on to the budget, Claude
Code's own report of that) and that every request it made reached the edge tier through `/v1/messages`.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway.conftest import write_policy
from tests.support.edge import EdgeProcess, parse_metrics, start_edge_node
from tests.support.servers import gateway_server
from tiergate.edge_node.model.packaged import packaged_path
from tiergate.gateway.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.clients, pytest.mark.timeout(900)]

BUDGET = 1024  # output tokens Claude Code asks for (CLAUDE_CODE_MAX_OUTPUT_TOKENS); the prompt is about 1,700
CLAUDE = Path(__file__).resolve().parents[2] / ".tiergate" / "clients" / "node_modules" / ".bin" / "claude"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EdgeProcess]:
    with start_edge_node(packaged_path("smollm2-135m-instruct"), "--parallel", "1", "--ctx", "4096",
                         "--model-name", "smollm2", workdir=tmp_path_factory.mktemp("smollm2")) as n:
        yield n


def _requests(url: str) -> dict[tuple[str, str, str], float]:
    samples = parse_metrics(httpx.get(url + "/metrics").text)
    return {(lab["endpoint"], lab["tier"], lab["status"]): v for (name, labels), v in samples.items()
            if name == "tiergate_requests_total" for lab in [dict(labels)]}


def test_claude_code_completes_a_request_through_the_messages_api_on_the_edge(node: EdgeProcess, tmp_path: Path):
    assert CLAUDE.exists(), "Claude Code is missing: scripts/setup.sh --dev installs it (tests/clients)"
    policy = write_policy(tmp_path / "policy.yaml", [node.url], ["http://127.0.0.1:9"], fallback=False, cache=False,
                          first_byte_s=600, total_s=600)
    policy.write_text(policy.read_text() + 'model_aliases:\n  "claude-*": edge\n')
    home = tmp_path / "home"
    home.mkdir()
    with gateway_server(Settings(policy=policy, embedder=None, redis_url=None)) as gw:
        env = {"PATH": os.environ["PATH"], "HOME": str(home), "ANTHROPIC_BASE_URL": gw.url,
               "ANTHROPIC_API_KEY": "tg-demo-key", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
               "DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(BUDGET)}
        done = subprocess.run([str(CLAUDE), "-p", "Reply with the single word: OK", "--tools", ""], env=env,
                              capture_output=True, text=True, timeout=800, stdin=subprocess.DEVNULL)
        said = f"exit {done.returncode}\nstdout: {done.stdout[-2000:]}\nstderr: {done.stderr[-2000:]}"
        if done.returncode != 0:
            # Claude Code sends no temperature (Anthropic's default is 1.0), so the 135M model sometimes writes on
            # to the output budget: a complete answer stopped at max_tokens, which Claude Code reports as its own
            # limit. Anything else (an error status, a broken stream) fails here.
            assert f"exceeded the {BUDGET} output token maximum" in done.stdout, said
        else:
            assert done.stdout.strip() and "API Error" not in done.stdout, said
        requests = _requests(gw.url)
        assert set(requests) == {("messages", "edge", "200")} and requests[("messages", "edge", "200")] >= 1, requests
