"""Structured output on the edge: JSON mode, JSON schemas and tool calls, by grammar-constrained decoding.

llama.cpp can restrict sampling to a GBNF grammar, so the answer is valid JSON every time (unless cut at
max_tokens): `response_format: {"type": "json_object"}` uses llama.cpp's JSON grammar; `json_schema` and tool
calls use a grammar converted from the schema (llama-cpp-python's port of llama.cpp's json-schema-to-grammar).

Tool calls are generated as `{"name": ..., "arguments": {...}}` constrained to the tools offered, and answered
in OpenAI's `tool_calls` shape. `tool_choice: "required"` or a named function: the answer is one call, or
with `parallel_tool_calls` (OpenAI's default) a JSON array of one or more calls. `tool_choice: "auto"` (the default when tools are given): the grammar allows either free text, which cannot
start with `{` (nor `[` with parallel calls) or whitespace, or a call; with `parallel_tool_calls` (OpenAI's
default) also a JSON array of calls. So the first character tells a call from text, which lets a streamed text
answer flow token by token. llama.cpp's own "generic" tool format makes the same choice inside a JSON wrapper
(`{"tool_call": ...}` or `{"response": "..."}`); plain text here keeps text answers streaming and as the model
would write them. `tool_choice: "none"` answers in text. Bad definitions are 400s naming the field.

A tool's parameters are nested one level down in the call's schema, so their local `$ref`s (`#/$defs/Unit`, as
pydantic writes for every enum and nested model) are resolved against the tool's own parameters and inlined
before the grammar is built. A cyclic `$ref` (a recursive model) is refused with 400 `unsupported_value`
naming the tool, which a gateway reads as "another tier may serve it"; a `$ref` that points nowhere or outside
the tool is the request's fault (`invalid_schema`).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

from tiergate.core.errors import bad_request

__all__ = ["Structured", "ToolCallOutput", "inline_refs", "plan", "read_tool_call", "read_tool_calls"]

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_MAX_INLINED_NODES = 20_000  # a schema whose refs unfold past this is refused, not expanded without bound
_ROOT_LINE = re.compile(r"^root ::= ", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Structured:
    """How to constrain and read one request's answer."""

    grammar: str  # GBNF, root rule `root`
    tool_call: bool  # the answer is one tool call, to be returned as `tool_calls`
    system_note: str | None = None  # what the model is told about the tools (its template cannot render them)
    auto: bool = False  # `tool_choice: auto`: the answer is text, or a call when it starts with `{`
    parallel: bool = False  # an answer starting with `[` is several calls

    def is_call(self, text: str) -> bool:
        """Whether an answer (or its first characters) is tool calls rather than text."""
        if self.tool_call:
            return True
        head = text.lstrip()[:1]
        return self.auto and (head == "{" or (self.parallel and head == "["))


@dataclass(frozen=True, slots=True)
class ToolCallOutput:
    name: str
    arguments: str  # JSON text, as OpenAI sends it

    def as_openai(self) -> dict[str, Any]:
        return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


def _schema_grammar(schema: Any, field: str) -> str:
    if not isinstance(schema, dict):
        raise bad_request(f"`{field}` must be a JSON Schema object.", param=field)
    try:
        grammar: str = json_schema_to_gbnf(json.dumps(schema))  # llama-cpp-python leaves it unannotated
        return grammar
    except Exception as exc:  # noqa: BLE001 - the converter raises whatever the schema trips on
        raise bad_request(f"`{field}` cannot be turned into a grammar: {type(exc).__name__}: {exc}",
                          code="invalid_schema", param=field) from None


def _pointer(root: dict[str, Any], ref: str, tool: str, param: str) -> Any:
    """The part of a tool's parameters that a local `$ref` (`#`, `#/$defs/X`, any JSON pointer) names."""
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        raise bad_request(f"`{param}`: tool {tool!r} has `$ref` {ref!r}; only references inside the tool's own "
                          "parameters (`#/$defs/...`) are supported.", code="invalid_schema", param=param)
    target: Any = root
    for raw in ref[2:].split("/"):
        part = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and part in target:
            target = target[part]
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            raise bad_request(f"`{param}`: tool {tool!r} has `$ref` {ref!r}, which points nowhere in its "
                              "parameters.", code="invalid_schema", param=param)
    return target


def inline_refs(schema: dict[str, Any], tool: str, param: str) -> dict[str, Any]:
    """The tool's parameters with every local `$ref` replaced by what it points to (its `$defs` dropped).

    Keywords beside a `$ref` (pydantic puts `description` or `default` there) are kept over the target's.
    A `$ref` met again inside its own expansion is a cycle: 400 `unsupported_value` naming the tool."""
    seen = 0

    def walk(node: Any, expanding: tuple[str, ...]) -> Any:
        nonlocal seen
        seen += 1
        if seen > _MAX_INLINED_NODES:
            raise bad_request(f"`{param}`: tool {tool!r} has parameters whose `$ref`s unfold past "
                              f"{_MAX_INLINED_NODES} schema nodes.", code="invalid_schema", param=param)
        if isinstance(node, list):
            return [walk(x, expanding) for x in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if not isinstance(ref, str):
            return {k: walk(v, expanding) for k, v in node.items() if k != "$defs"}
        if ref in expanding:
            chain = " -> ".join((*expanding[expanding.index(ref):], ref))
            raise bad_request(f"`{param}`: tool {tool!r} has a cyclic `$ref` ({chain}); recursive schemas are not "
                              "supported by the edge node.", code="unsupported_value", param=param)
        target = walk(_pointer(schema, ref, tool, param), (*expanding, ref))
        siblings = {k: walk(v, expanding) for k, v in node.items() if k not in ("$ref", "$defs")}
        if not siblings:
            return target
        if isinstance(target, dict):
            return {**target, **siblings}
        return {"allOf": [target, siblings]}

    try:
        out: dict[str, Any] = walk(schema, ())
    except RecursionError:
        raise bad_request(f"`{param}`: tool {tool!r} has parameters nested too deeply.", code="invalid_schema",
                          param=param) from None
    out.pop("definitions", None)  # the draft-07 home of definitions, at the top only: a property may be so named
    return out


def _tools(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """name → parameters schema, validated."""
    out: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise bad_request(f"`{where}.type` must be \"function\".", param=f"{where}.type")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise bad_request(f"`{where}.function` must be an object.", param=f"{where}.function")
        name = fn.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.match(name):
            raise bad_request(f"`{where}.function.name` must be 1-64 letters, digits, _ or -.",
                              param=f"{where}.function.name")
        if name in out:
            raise bad_request(f"`{where}.function.name`: {name!r} is defined twice.", param=f"{where}.function.name")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise bad_request(f"`{where}.function.parameters` must be a JSON Schema object.",
                              param=f"{where}.function.parameters")
        out[name] = inline_refs(params, name, f"{where}.function.parameters")
    return out


def _tool_note(tools: list[dict[str, Any]], auto: bool = False, parallel: bool = False) -> str:
    several = " (to call several at once: a JSON array of such objects)" if parallel else ""
    if not auto:
        head = ("You can call these functions. Answer with one JSON object "
                f"{{\"name\": ..., \"arguments\": {{...}}}}{several}.")
    else:
        head = ("You can call these functions. To call one, answer with only a JSON object "
                f"{{\"name\": ..., \"arguments\": {{...}}}}{several}. Otherwise answer the user in plain text.")
    lines = [head]
    for tool in tools:
        fn = tool["function"]
        lines.append(f"- {fn['name']}: {fn.get('description', '')} Parameters: "
                     f"{json.dumps(fn.get('parameters', {}), separators=(',', ':'))}")
    return "\n".join(lines)


_CALLS = 'tool-call | "[" space tool-call ("," space tool-call)* "]" space'  # one call, or an array of them


def _calls_grammar(call_grammar: str, parallel: bool) -> str:
    """The calls only: one call, or with parallel calls also a JSON array of one or more (the root renamed)."""
    if not parallel:
        return call_grammar
    return _ROOT_LINE.sub("tool-call ::= ", call_grammar, count=1) + f"\nroot ::= {_CALLS}"


def _auto_grammar(call_grammar: str, parallel: bool) -> str:
    """Free text or the call(s): the call grammar's root renamed, and a root that offers both.

    Text starts with neither `{` (nor `[` with parallel calls) nor whitespace, so its first character tells it
    from a call; after that it is anything."""
    grammar = _ROOT_LINE.sub("tool-call ::= ", call_grammar, count=1)
    calls = _CALLS if parallel else "tool-call"
    first = "[^{[ \\t\\r\\n]" if parallel else "[^{ \\t\\r\\n]"
    return f"{grammar}\nroot ::= {calls} | text\ntext ::= {first} [^\\x00]*"


def plan(response_format: dict[str, Any] | None, tools: list[dict[str, Any]] | None,
         tool_choice: str | dict[str, Any] | None, parallel_tool_calls: bool | None = None) -> Structured | None:
    """The grammar a chat request's answer must follow, or None for free text; raises a 400 naming the field.

    `parallel_tool_calls` (OpenAI's default: true) lets any `tool_choice` but `none` answer with several calls;
    false allows exactly one."""
    if tools and tool_choice != "none":
        schemas = _tools(tools)
        parallel = parallel_tool_calls is not False
        if tool_choice in (None, "auto"):
            call = {"oneOf": [{"type": "object", "properties": {"name": {"const": n}, "arguments": s},
                               "required": ["name", "arguments"], "additionalProperties": False}
                              for n, s in schemas.items()]}
            return Structured(_auto_grammar(_schema_grammar(call, "tools"), parallel), tool_call=False,
                              system_note=_tool_note(tools, auto=True, parallel=parallel), auto=True,
                              parallel=parallel)
        if tool_choice == "required":
            chosen = list(schemas)
        elif isinstance(tool_choice, dict) and tool_choice.get("type") == "function" \
                and isinstance(tool_choice.get("function"), dict):
            name = tool_choice["function"].get("name")
            if name not in schemas:
                raise bad_request(f"`tool_choice.function.name`: {name!r} is not one of the tools.",
                                  param="tool_choice.function.name")
            chosen = [name]
        else:
            raise bad_request("`tool_choice` must be \"none\", \"auto\", \"required\" or "
                              "{\"type\": \"function\", \"function\": {\"name\": ...}}.", param="tool_choice")
        call = {"oneOf": [{"type": "object", "properties": {"name": {"const": n}, "arguments": schemas[n]},
                           "required": ["name", "arguments"], "additionalProperties": False} for n in chosen]}
        grammar = _calls_grammar(_schema_grammar(call, "tools"), parallel)
        return Structured(grammar, tool_call=True, parallel=parallel,
                          system_note=_tool_note([t for t in tools if t["function"]["name"] in chosen],
                                                 parallel=parallel))
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return Structured(JSON_GBNF, tool_call=False)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise bad_request("`response_format.json_schema` must be an object with `name` and `schema`.",
                              param="response_format.json_schema")
        return Structured(_schema_grammar(spec["schema"], "response_format.json_schema.schema"), tool_call=False)
    raise bad_request(f"`response_format.type` {kind!r} is not one of text, json_object, json_schema.",
                      param="response_format.type")


def read_tool_calls(text: str) -> list[ToolCallOutput]:
    """The calls in a grammar-constrained answer: one object, or (parallel calls) an array of them."""
    try:
        obj = json.loads(text)
    except ValueError:
        return [read_tool_call(text)]
    if isinstance(obj, list):
        return [ToolCallOutput(str(o.get("name", "")), json.dumps(o.get("arguments", {}), ensure_ascii=False))
                for o in obj if isinstance(o, dict)] or [read_tool_call(text)]
    return [read_tool_call(text)]


def read_tool_call(text: str) -> ToolCallOutput:
    """The tool call in a grammar-constrained answer; a cut-off answer keeps its raw text as the arguments."""
    try:
        obj = json.loads(text)
    except ValueError:
        name = re.search(r'"name"\s*:\s*"([^"]*)"', text)
        return ToolCallOutput(name.group(1) if name else "", text)
    return ToolCallOutput(str(obj.get("name", "")), json.dumps(obj.get("arguments", {}), ensure_ascii=False))
