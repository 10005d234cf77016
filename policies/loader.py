"""Reading a policy file with errors that point at the exact place: file:line:column, field, what is allowed.

The YAML is parsed once with ruamel's round-trip loader, which remembers the line and column of every
key and item; pydantic validates a plain copy; both pydantic's errors and the whole-file checks of
`policies.checks.semantic_issues` come back as paths into the document, which are mapped to positions here.
Every problem in the file is reported at once, so an operator fixes them in one pass.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails
from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from tiergate.policies.checks import Issue, semantic_issues
from tiergate.policies.model import Policy

__all__ = ["DEFAULT_POLICY", "PolicyError", "Problem", "check_policy", "load_policy", "parse_policy"]

DEFAULT_POLICY = Path(__file__).resolve().parent / "default.yaml"  # the packaged policy


@dataclass(frozen=True, slots=True)
class Problem:
    """One problem, located: `source:line:column: field: message`."""

    source: str
    line: int | None
    column: int | None
    field: str
    message: str
    severity: Literal["error", "warning"] = "error"

    def __str__(self) -> str:
        where = f"{self.line}:{self.column}" if self.line is not None else "?"
        field = f" `{self.field}`:" if self.field else ""
        tag = "" if self.severity == "error" else " warning:"
        return f"{self.source}:{where}:{tag}{field} {self.message}"


class PolicyError(ValueError):
    """An invalid policy. `problems` lists every error found; str() shows them all, one per line."""

    def __init__(self, source: str, problems: list[Problem]) -> None:
        self.source = source
        self.problems = problems
        lines = [str(p) for p in problems]
        super().__init__(lines[0] if len(lines) == 1 else f"{len(lines)} problems\n  " + "\n  ".join(lines))


# ------------------------------------------------------------------------------------------- locating


def format_path(loc: tuple[str | int, ...]) -> str:
    """('rules', 2, 'when', 'complexity') → 'rules[2].when.complexity'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _position(doc: Any, loc: tuple[str | int, ...], at_key: bool) -> tuple[int, int]:
    """1-based (line, column) of the deepest node along `loc` present in the document.

    Path parts the document does not have (pydantic's union tags, a missing field) are skipped, so the
    position is the closest existing node. `at_key` points at a mapping key rather than its value.
    """
    node = doc
    line, col = 1, 1
    lc = getattr(node, "lc", None)
    if lc is not None:
        line, col = lc.line + 1, lc.col + 1
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        lc = getattr(node, "lc", None)
        if isinstance(node, dict) and isinstance(part, str) and part in node:
            child = node[part]
            if lc is not None:
                # A scalar is pointed at itself; a mapping or list at its key (`cloud:`), which reads better
                # than its first child's line, and is where a missing field belongs.
                use_key = (at_key and last) or isinstance(child, (dict, list)) or not _has_value_pos(lc, part)
                try:
                    pos = lc.key(part) if use_key else lc.value(part)
                    line, col = pos[0] + 1, pos[1] + 1
                except (KeyError, TypeError):
                    pass
            node = child
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            if lc is not None:
                try:
                    pos = lc.item(part)
                    line, col = pos[0] + 1, pos[1] + 1
                except (KeyError, TypeError):
                    pass
            node = node[part]
    return line, col


def _has_value_pos(lc: Any, key: str) -> bool:
    try:
        lc.value(key)
        return True
    except (KeyError, TypeError):
        return False


def _plain(node: Any) -> Any:
    """ruamel's round-trip containers and scalars as plain Python values (pydantic sees ordinary types)."""
    if isinstance(node, dict):
        return {(_plain(k) if not isinstance(k, str) else str(k)): _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    if isinstance(node, bool):
        return bool(node)
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return str(node)
    return node


# ------------------------------------------------------------------------------- what is allowed where


def _unwrap(tp: Any) -> list[Any]:
    """The concrete alternatives of a type annotation (Optional/Union/Annotated removed)."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        out = []
        for a in typing.get_args(tp):
            if a is not type(None):
                out.extend(_unwrap(a))
        return out
    return [tp]


def _model_at(loc: tuple[str | int, ...]) -> type[BaseModel] | None:
    """The pydantic model class that validates the mapping at `loc` (for listing allowed fields)."""
    current: list[Any] = [Policy]
    for part in loc:
        nxt: list[Any] = []
        for tp in current:
            for alt in _unwrap(tp):
                origin = typing.get_origin(alt)
                if isinstance(alt, type) and issubclass(alt, BaseModel) and isinstance(part, str):
                    for name, f in alt.model_fields.items():
                        if part in (name, f.alias):
                            nxt.append(f.annotation)
                elif origin is dict and isinstance(part, str):
                    nxt.append(typing.get_args(alt)[1])
                elif origin is list and isinstance(part, int):
                    nxt.append(typing.get_args(alt)[0])
        if not nxt:
            continue  # a pydantic union tag or similar: stay where we are
        current = nxt
    for tp in current:
        for alt in _unwrap(tp):
            if isinstance(alt, type) and issubclass(alt, BaseModel):
                return alt
    return None


def _fields_of(model: type[BaseModel]) -> str:
    return ", ".join(f.alias or name for name, f in model.model_fields.items() if name != "name" or
                     model.__name__ != "TierConfig")


def _message(err: ErrorDetails) -> str:
    kind = err["type"]
    loc = tuple(err["loc"])
    msg = str(err["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if kind == "extra_forbidden":
        model = _model_at(loc[:-1])
        allowed = f"; allowed here: {_fields_of(model)}" if model is not None else ""
        return f"unknown field {loc[-1]!r}{allowed}"
    if kind == "missing":
        return f"required field {loc[-1]!r} is missing"
    if kind in ("model_type", "dict_type"):
        model = _model_at(loc)
        fields = f" with fields {_fields_of(model)}" if model is not None else ""
        return f"expected a mapping{fields}, got {_shown(err.get('input'))}"
    if kind == "literal_error":
        return msg.replace("Input should be", "must be") + f", got {_shown(err.get('input'))}"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "string_pattern_mismatch",
                "int_parsing", "float_parsing", "bool_parsing", "int_type", "float_type", "string_type",
                "bool_type", "list_type", "too_short", "int_from_float", "string_too_short"):
        return msg.replace("Input should", "must") + f", got {_shown(err.get('input'))}"
    return msg


def _shown(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return "a mapping" if isinstance(value, dict) else "a list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _locate(source: str, doc: Any, loc: tuple[str | int, ...], message: str, severity: str = "error",
            at_key: bool = False) -> Problem:
    line, col = _position(doc, loc, at_key)
    field = format_path(tuple(p for p in loc if not _is_tag(p)))
    return Problem(source, line, col, field, message, severity)  # type: ignore[arg-type]


def _is_tag(part: str | int) -> bool:
    """pydantic inserts the name of a union member or validator into error locations."""
    return isinstance(part, str) and ("[" in part or part.startswith(("function-", "list", "dict")) or
                                      part in ("int", "str", "float", "bool"))


def _unreadable_scalar(text: str) -> tuple[int | None, int | None, str | None]:
    """Where the first scalar that resolves to a number but does not read as one is (ruamel resolves `._` as a
    float, then fails to construct it with a bare ValueError, which has no position)."""
    try:
        root = YAML(typ="rt").compose(text)
    except (YAMLError, ValueError):
        return None, None, None
    stack = [root] if root is not None else []
    while stack:
        node = stack.pop()
        if isinstance(node.value, list):
            for item in reversed(node.value):
                stack.extend(reversed(item) if isinstance(item, tuple) else [item])
        elif node.tag.endswith((":float", ":int")):
            digits = node.value.replace("_", "").lower().lstrip("+-")
            if digits not in (".inf", ".nan") and not _reads_as_number(digits):
                return node.start_mark.line + 1, node.start_mark.column + 1, node.value
    return None, None, None


def _reads_as_number(s: str) -> bool:
    for conv in (float, lambda v: int(v, 0)):
        try:
            conv(s)
            return True
        except ValueError:
            pass
    return ":" in s  # YAML 1.1 sexagesimal (1:30): ruamel reads these itself


# ------------------------------------------------------------------------------------------ public API


def check_policy(text: str, source: str = "<policy>", base_dir: Path | None = None) -> tuple[Policy | None,
                                                                                              list[Problem]]:
    """Parse and validate; returns the policy (None when invalid) and every problem, warnings included."""
    try:
        doc = YAML(typ="rt").load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (None, None)
        what = " ".join(s for s in (exc.context, exc.problem) if s) or "invalid YAML"
        return None, [Problem(source, line, col, "", f"YAML syntax error: {what} (a half-written file?)")]
    except YAMLError as exc:
        return None, [Problem(source, None, None, "", f"YAML error: {exc}")]
    except (ValueError, TypeError, OverflowError) as exc:  # ruamel's constructor on a scalar it resolved wrongly
        line, col, value = _unreadable_scalar(text)
        what = f"`{value}` looks like a number but is not one" if value is not None else str(exc)
        return None, [Problem(source, line, col, "", f"YAML error: {what}; quote it if it is text")]
    if doc is None:
        return None, [Problem(source, 1, 1, "", "the policy is empty; it needs at least `tiers` and `rules`")]
    if not isinstance(doc, dict):
        return None, [Problem(source, 1, 1, "", "a policy is a mapping with `tiers` and `rules` "
                                                 "(see policies/default.yaml)")]
    try:
        policy = Policy.model_validate(_plain(doc))
    except ValidationError as exc:
        problems = [_locate(source, doc, tuple(e["loc"]), _message(e), at_key=e["type"] == "extra_forbidden")
                    for e in exc.errors()]
        return None, problems
    policy.bind(source, base_dir or Path.cwd())
    issues: list[Issue] = semantic_issues(policy)
    problems = [_locate(source, doc, i.path, i.message, i.severity) for i in issues]
    if any(p.severity == "error" for p in problems):
        return None, problems
    policy.bind(source, base_dir or Path.cwd(), tuple(str(p) for p in problems))
    return policy, problems


def parse_policy(text: str, source: str = "<policy>", base_dir: Path | None = None) -> Policy:
    """Validate policy YAML text; raises PolicyError listing every problem. Warnings stay on `.warnings`."""
    policy, problems = check_policy(text, source, base_dir)
    if policy is None:
        raise PolicyError(source, [p for p in problems if p.severity == "error"])
    return policy


def load_policy(path: str | Path) -> Policy:
    """Read and validate a policy file; relative paths inside it resolve against its directory."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise PolicyError(str(path), [Problem(str(path), None, None, "", f"cannot read the policy file: {reason}")]) \
            from None
    return parse_policy(text, str(path), path.resolve().parent)
