"""A gated adapter rolled out to edge nodes: a canary share first, judged on live answers, then all or none.

The canary nodes swap to the adapter (`POST /admin/lora` on each node; the file must already be in the nodes'
`--lora-dir`, a shared store or a copy), then canaries and the nodes still on the current adapter answer the same
probe questions, whose expected answers the operator knows (the gate's held-out slice), scored as the gate scores
(`core.answers.agrees`). The adapter is promoted to
every node when the canaries beat the others by the margin; otherwise the canaries go back to the previous adapter.
The nodes keep serving throughout: a swap drops no request (edge_node/engine/lora_swap.py).

Tested in `tests/gateway/test_rollout.py`.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from tiergate.core.answers import agrees

__all__ = ["NodeError", "Probe", "RolloutResult", "load_probes", "rollout"]


class NodeError(RuntimeError):
    """A node refused a swap or a probe answer; says which node and why."""


@dataclass(frozen=True, slots=True)
class Probe:
    messages: list[dict[str, str]]
    expected: str


@dataclass(frozen=True, slots=True)
class RolloutResult:
    promoted: bool
    reason: str
    canary_points: float
    control_points: float
    canaries: list[str]
    controls: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {"promoted": self.promoted, "reason": self.reason, "canary_points": round(self.canary_points, 2),
                "control_points": round(self.control_points, 2), "canaries": self.canaries, "controls": self.controls}


def load_probes(path: Path) -> list[Probe]:
    """Probe questions in the export's format (the gate's heldout.jsonl): the last message is the expected answer."""
    out = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            msgs = json.loads(line)["messages"]
            out.append(Probe([{"role": m["role"], "content": m["content"]} for m in msgs[:-1]], msgs[-1]["content"]))
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise ValueError(f"{path}:{lineno}: expected {{\"messages\": [..., {{\"role\": \"assistant\", "
                             f"\"content\": ...}}]}} ({type(exc).__name__}: {exc})") from None
    return out


async def _swap(client: aiohttp.ClientSession, node: str, adapter: str | None) -> None:
    async with client.post(node + "/admin/lora", json={"adapter": adapter}) as r:
        if r.status != 200:
            raise NodeError(f"{node}: swap to {adapter!r} refused ({r.status}): {(await r.text())[:300]}")


async def _points(client: aiohttp.ClientSession, nodes: list[str], probes: list[Probe], max_tokens: int) -> float:
    correct = total = 0
    for node in nodes:
        for p in probes:
            async with client.post(node + "/v1/chat/completions", json={
                    "model": "edge", "messages": p.messages, "max_tokens": max_tokens, "temperature": 0}) as r:
                if r.status != 200:
                    raise NodeError(f"{node}: probe answered {r.status}: {(await r.text())[:300]}")
                text = (await r.json())["choices"][0]["message"]["content"] or ""
            question = "\n".join(m["content"] for m in p.messages if m["role"] == "user")
            correct += agrees(question, text, p.expected)  # as the training gate scores (core.answers)
            total += 1
    return 100.0 * correct / total if total else 0.0


async def rollout(nodes: list[str], adapter: str, probes: list[Probe], *, canary: int = 1, margin: float = 0.0,
                  previous: str | None = None, api_key: str | None = None, max_tokens: int = 32,
                  timeout_s: float = 300.0) -> RolloutResult:
    """Swap `canary` of `nodes` to `adapter`, compare them with the rest on `probes`, then promote or roll back."""
    if not 0 < canary < len(nodes):
        raise ValueError(f"canary must be at least 1 and leave a node to compare with: {canary} of {len(nodes)}")
    canaries, controls = nodes[:canary], nodes[canary:]
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)) as client:
        swapped: list[str] = []
        try:
            for node in canaries:
                await _swap(client, node, adapter)
                swapped.append(node)
            cand, base = await asyncio.gather(_points(client, canaries, probes, max_tokens),
                                              _points(client, controls, probes, max_tokens))
        except (NodeError, aiohttp.ClientError, TimeoutError):
            for node in swapped:  # back to where they were before the error is reported
                await _swap(client, node, previous)
            raise
        if probes and cand >= base + margin:
            for node in controls:
                await _swap(client, node, adapter)
            return RolloutResult(True, f"canaries {cand:.1f} points against {base:.1f}: promoted to every node",
                                 cand, base, canaries, controls)
        for node in canaries:
            await _swap(client, node, previous)
        return RolloutResult(False, f"canaries {cand:.1f} points against {base:.1f} (margin {margin:g}): "
                                    "rolled back", cand, base, canaries, controls)
