"""Asking the real edge node: `edge-node serve` over HTTP (the path the gateway uses), streamed, greedy.

Every answer is streamed with `logprobs` and `top_logprobs: 2` (the runner-up gives the margin signal), so
one request yields the answer, its token scores and the arrival time of every token: the time a "hold"
cascade waits (the whole answer) and the time a "first-k" cascade waits (k tokens) come from the same run.
The node's CPU time (/proc) is read before and after each request: with one request in flight at a time
(the default) the difference is that request's edge CPU cost.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from bench.cascade.tasks import Item
from bench.procs import cpu_seconds
from tiergate.policies.confidence import TokenScore, scores_from_openai

__all__ = ["Answer", "ask", "ask_all"]


@dataclass
class Answer:
    """One streamed answer of the edge node, with what a cascade would read from it."""

    text: str
    finish_reason: str | None
    scores: list[TokenScore]
    token_times: list[float]  # seconds from sending the request to each scored token's arrival
    done_s: float  # seconds from sending to the end of the stream
    prompt_tokens: int
    completion_tokens: int
    cpu_s: float  # the node's CPU seconds while this request ran (only its own at concurrency 1)


def _events(resp) -> Iterator[dict]:  # noqa: ANN001 - an http.client.HTTPResponse
    for raw in resp:
        line = raw.strip()
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            yield json.loads(line[6:])


def ask(url: str, prompt: str, max_tokens: int, pid: int | None = None, model: str = "edge",
        timeout_s: float = 300, headers: Mapping[str, str] | None = None) -> Answer:
    """Ask one chat question, greedy, and read the stream to its end (`headers`: e.g. a gateway's API key)."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "logprobs": True, "top_logprobs": 2, "stream": True,
            "stream_options": {"include_usage": True}}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json", **(headers or {})})
    cpu0 = cpu_seconds(pid) if pid else 0.0
    t0 = time.perf_counter()
    text: list[str] = []
    entries: list[dict] = []
    times: list[float] = []
    finish, usage = None, {}
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        for ev in _events(resp):
            now = time.perf_counter() - t0
            usage = ev.get("usage") or usage
            for ch in ev.get("choices") or ():
                text.append((ch.get("delta") or {}).get("content") or "")
                got = (ch.get("logprobs") or {}).get("content") or []
                entries += got
                times += [now] * len(got)
                finish = ch.get("finish_reason") or finish
    done = time.perf_counter() - t0
    cpu = cpu_seconds(pid) - cpu0 if pid else float("nan")
    return Answer("".join(text), finish, scores_from_openai(entries), times, done,
                  int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", len(entries))), cpu)


def ask_all(url: str, items: Sequence[Item], max_tokens: int, pid: int | None, concurrency: int = 1,
            progress: Callable[[int], None] | None = None, model: str = "edge") -> list[Answer]:
    """Answers to every item, in item order; `concurrency` requests in flight (1: clean per-request CPU)."""
    if concurrency <= 1:
        out = []
        for k, it in enumerate(items, 1):
            out.append(ask(url, it.prompt, max_tokens, pid, model))
            if progress:
                progress(k)
        return out
    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(lambda it: ask(url, it.prompt, max_tokens, None, model), items))
