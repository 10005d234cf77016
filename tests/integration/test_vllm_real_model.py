"""vLLM serving the real model: the answers are SmolLM2's, and n-gram speculative decoding changes no greedy answer.

The shared test servers (tests/support/vllm.py) speculate with n-grams; one more server without speculation is
started here for the comparison, then stopped (each costs ~3.6 GB).
"""

from __future__ import annotations

import httpx
import pytest

from tests.support.edge import parse_metrics
from tests.support.vllm import MODEL_NAME, START_TIMEOUT_S, require_vllm_python, server_spec
from tiergate.cloud_pool.process import VllmProcess, VllmStartError, free_port

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.timeout(1200)]

# Repetitive prompts, where n-gram drafts are accepted, and ordinary ones.
PROMPTS = [
    "Repeat exactly: red green blue, red green blue, red green blue, red green blue.",
    "List the numbers from 1 to 20 separated by commas.",
    "Copy this sentence twice: The cat sat on the mat.",
    "What is the capital of France? Answer with one word.",
    "Write a haiku about the sea.",
    "Say the word 'hello' five times.",
]


def _greedy(base_url: str, prompt: str) -> str:
    r = httpx.post(base_url + "/v1/chat/completions", timeout=300, json={
        "model": MODEL_NAME, "messages": [{"role": "user", "content": prompt}], "max_tokens": 48, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


@pytest.fixture(scope="module")
def plain_server(real_vllm_model, tmp_path_factory):
    server = VllmProcess.from_spec(server_spec(real_vllm_model, speculative=False),
                                   tmp_path_factory.mktemp("vllm-plain"), python=str(require_vllm_python()),
                                   port=free_port())
    try:
        server.wait_healthy(START_TIMEOUT_S)
    except VllmStartError as exc:
        server.terminate()
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        server.terminate()


def test_the_real_model_answers_and_speculation_changes_no_greedy_answer(vllm_servers, plain_server):
    (speculating,) = vllm_servers.get(1)
    with_spec = [_greedy(speculating.base_url, p) for p in PROMPTS]
    without = [_greedy(plain_server.base_url, p) for p in PROMPTS]
    assert with_spec == without
    assert "Paris" in with_spec[3]  # SmolLM2's own answer (random weights would not know)
    metrics = parse_metrics(httpx.get(speculating.base_url + "/metrics", timeout=10).text)
    accepted = sum(v for (name, _), v in metrics.items() if name == "vllm:spec_decode_num_accepted_tokens_total")
    drafted = sum(v for (name, _), v in metrics.items() if name == "vllm:spec_decode_num_draft_tokens_total")
    assert drafted > 0 and accepted > 0  # drafts were made and some accepted on the repetitive prompts
    models = httpx.get(speculating.base_url + "/v1/models", timeout=10).json()["data"][0]
    assert models["id"] == MODEL_NAME and models["max_model_len"] == 1024
