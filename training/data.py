"""An export file read, deduplicated and split into training rows and a held-out slice that shares nothing with them.

Paraphrases of one question would leak across a random row split and make the held-out score a memory test, so
the split is by cluster: rows that share a normalised prompt or a normalised answer are one cluster, and a cluster
goes wholly to one side. The held-out side is the newest clusters (the export is in capture order: what the
traffic looks like next) plus a stable hashed share of the older ones.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ExportError", "Example", "Split", "cluster_ids", "dedupe", "file_digest", "load_export", "normalise",
           "split"]


class ExportError(ValueError):
    """The export file is not what `tiergate distill export` writes; says which file and line."""


@dataclass(frozen=True, slots=True)
class Example:
    """One captured exchange: the prompt's messages and the cloud's answer, at its place in capture order."""

    messages: tuple[tuple[str, str], ...]  # (role, content) of everything before the answer
    answer: str
    position: int

    @property
    def chat(self) -> list[dict[str, str]]:
        return [{"role": r, "content": c} for r, c in self.messages]

    @property
    def prompt_text(self) -> str:
        return "\n".join(c for r, c in self.messages if r == "user")


@dataclass(frozen=True, slots=True)
class Split:
    train: list[Example]
    heldout: list[Example]


def normalise(text: str) -> str:
    """Case, punctuation and spacing removed: what makes two answers (or two prompts) the same for the checks."""
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def _row(path: Path, lineno: int, raw: Any) -> Example:
    where = f"{path}:{lineno}"
    if not isinstance(raw, dict):
        raise ExportError(f"{where}: a line must be a JSON object")
    if "messages" in raw:
        msgs = raw["messages"]
        if (not isinstance(msgs, list) or len(msgs) < 2 or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in msgs)):
            raise ExportError(f"{where}: field 'messages' must be a list of {{role, content}} strings, at least 2")
        if msgs[-1]["role"] != "assistant":
            raise ExportError(f"{where}: field 'messages' must end with the assistant's answer")
        return Example(tuple((m["role"], m["content"]) for m in msgs[:-1]), msgs[-1]["content"], lineno)
    if isinstance(raw.get("prompt"), str) and isinstance(raw.get("completion"), str):
        return Example((("user", raw["prompt"]),), raw["completion"], lineno)
    raise ExportError(f"{where}: expected field 'messages' (chat) or 'prompt' and 'completion' (text)")


def load_export(path: Path) -> list[Example]:
    """Every example of an export file, in capture order."""
    out = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ExportError(f"{path}:{lineno}: not JSON ({exc.msg})") from None
            out.append(_row(path, lineno, raw))
    return out


def dedupe(examples: Iterable[Example]) -> list[Example]:
    """The first of each (normalised prompt, normalised answer) pair: repeats would weigh some answers double."""
    seen: set[tuple[str, str]] = set()
    out = []
    for ex in examples:
        key = (normalise(" ".join(c for _, c in ex.messages)), normalise(ex.answer))
        if key not in seen:
            seen.add(key)
            out.append(ex)
    return out


def cluster_ids(examples: list[Example]) -> list[int]:
    """A cluster id per example: rows joined by a shared normalised prompt or answer (union-find)."""
    parent = list(range(len(examples)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[str, int] = {}
    for i, ex in enumerate(examples):
        for key in ("p:" + normalise(ex.prompt_text), "a:" + normalise(ex.answer)):
            j = first.setdefault(key, i)
            parent[find(i)] = find(j)
    return [find(i) for i in range(len(examples))]


def split(examples: list[Example], heldout_share: float = 0.2, newest_share: float = 0.1) -> Split:
    """Held out: the clusters of the newest `newest_share` of rows, then older clusters by a stable hash of their
    first prompt until about `heldout_share` of the rows are held out. No cluster is on both sides."""
    if not examples:
        return Split([], [])
    ids = cluster_ids(examples)
    members: dict[int, list[int]] = {}
    for i, c in enumerate(ids):
        members.setdefault(c, []).append(i)
    held: set[int] = {ids[i] for i in range(len(examples)) if i >= len(examples) * (1 - newest_share)}

    def rank(c: int) -> str:
        return hashlib.sha256(normalise(examples[members[c][0]].prompt_text).encode()).hexdigest()

    for c in sorted(members, key=rank):
        if sum(len(members[h]) for h in held) >= heldout_share * len(examples):
            break
        held.add(c)
    return Split([ex for ex, c in zip(examples, ids, strict=True) if c not in held],
                 [ex for ex, c in zip(examples, ids, strict=True) if c in held])


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
