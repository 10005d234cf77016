"""BFCL's cases and expected calls, from the pinned `bfcl-eval` wheel, as OpenAI chat requests.

The wheel is fetched once (pip download, no dependencies) into `.tiergate/bfcl/` and read as files: installing
the package would pull every model vendor's SDK (several GB, an audio library among them) for the four data files
and the checker this benchmark uses.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.report import REPO

__all__ = ["BFCL_VERSION", "CATEGORIES", "Case", "ensure_bfcl", "load_cases", "to_tool"]

BFCL_VERSION = "2026.3.23"  # bfcl-eval on PyPI, Apache-2.0; the one pin of this benchmark's data and checker
CATEGORIES = ("simple_python", "multiple", "parallel", "irrelevance")
_HOME = REPO / ".tiergate" / "bfcl"

# BFCL writes Python-flavoured types; JSON Schema (what an OpenAI tool's `parameters` is) spells them so.
_TYPES = {"dict": "object", "float": "number", "tuple": "array", "integer": "integer", "string": "string",
          "boolean": "boolean", "array": "array", "number": "number", "object": "object"}


@dataclass(frozen=True, slots=True)
class Case:
    id: str
    category: str
    messages: list[dict[str, Any]]
    functions: list[dict[str, Any]]  # as BFCL gives them (the checker reads these)
    answer: list[dict[str, Any]] | None  # BFCL's possible answers; None for irrelevance (no call is right)

    def tools(self) -> list[dict[str, Any]]:
        return [to_tool(f) for f in self.functions]


def ensure_bfcl() -> Path:
    """The unpacked wheel's folder (on sys.path afterwards), fetched from PyPI the first time."""
    root = _HOME / f"bfcl_eval-{BFCL_VERSION}"
    if not (root / "bfcl_eval" / "data").is_dir():
        _HOME.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(_HOME),
                        f"bfcl-eval=={BFCL_VERSION}"], check=True)
        wheel = next(_HOME.glob(f"bfcl_eval-{BFCL_VERSION}-*.whl"))
        with zipfile.ZipFile(wheel) as z:
            z.extractall(root)
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return root


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_cases(category: str, n: int) -> list[Case]:
    """The first `n` cases of a category, with their expected calls (single-turn: the first turn's messages)."""
    data = ensure_bfcl() / "bfcl_eval" / "data"
    rows = _rows(data / f"BFCL_v4_{category}.json")[:n]
    answers: dict[str, Any] = {}
    if category != "irrelevance":
        answers = {r["id"]: r["ground_truth"] for r in _rows(data / "possible_answer" / f"BFCL_v4_{category}.json")}
    return [Case(r["id"], category, r["question"][0], r["function"], answers.get(r["id"])) for r in rows]


def _schema(node: Any) -> Any:
    if isinstance(node, list):
        return [_schema(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _schema(v) for k, v in node.items() if k != "type"}
    kind = node.get("type")
    if isinstance(kind, str) and kind != "any":
        out["type"] = _TYPES.get(kind, kind)
    if out.get("type") == "object" and "properties" in node:
        out["properties"] = {k: _schema(v) for k, v in node["properties"].items()}
    return out


def to_tool(function: dict[str, Any]) -> dict[str, Any]:
    """A BFCL function as an OpenAI tool: `.` in names becomes `_` (OpenAI allows [A-Za-z0-9_-] only, as BFCL's
    own OpenAI handler does), and its parameter types as JSON Schema."""
    return {"type": "function", "function": {
        "name": function["name"].replace(".", "_"), "description": function.get("description", ""),
        "parameters": _schema(function.get("parameters", {"type": "dict", "properties": {}}))}}
