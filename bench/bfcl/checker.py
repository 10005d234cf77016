"""BFCL's own AST checker, imported from the unpacked wheel without its package's model registry.

`bfcl_eval.eval_checker.ast_eval.ast_checker` imports `MODEL_CONFIG_MAPPING`, whose module imports every model
handler and their SDKs; the checker only asks it whether a model's function names had `.` replaced by `_`. This
module registers one model, `tiergate`, that did (as `cases.to_tool` does), and nothing else is stood in for.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from typing import Any

from bench.bfcl.cases import Case, ensure_bfcl

__all__ = ["MODEL", "Verdict", "check"]

MODEL = "tiergate"


@dataclass(frozen=True, slots=True)
class _Config:
    underscore_to_dot: bool = True


def _checker() -> Any:
    ensure_bfcl()
    name = "bfcl_eval.constants.model_config"
    if name not in sys.modules:
        registry = types.ModuleType(name)
        registry.MODEL_CONFIG_MAPPING = {MODEL: _Config()}  # type: ignore[attr-defined]
        sys.modules[name] = registry
    # imported here: the unpacked wheel is on sys.path only now, and the registry stand-in must come first
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker

    return ast_checker, Language.PYTHON


@dataclass(frozen=True, slots=True)
class Verdict:
    right: bool
    why: str


def check(case: Case, calls: list[dict[str, Any]]) -> Verdict:
    """Whether the calls (`[{name: arguments}]`, names as sent to the model) are a right answer to `case`.
    Irrelevance cases are right when the model called nothing (BFCL's rule for that category)."""
    if case.answer is None:
        return Verdict(not calls, "no call" if not calls else f"called {[next(iter(c)) for c in calls]}")
    if not calls:
        return Verdict(False, "no call")
    ast_checker, python = _checker()
    result = ast_checker(case.functions, calls, case.answer, python, case.category, MODEL)
    return Verdict(bool(result["valid"]), "; ".join(map(str, result.get("error", [])))[:300])
