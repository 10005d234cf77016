"""What structured output asks of the decoder: a grammar for JSON, schemas and tool calls; 400s naming the field."""

from __future__ import annotations

import json

import pytest

from tiergate.core.errors import OpenAIError
from tiergate.edge_node.server.structured import plan, read_tool_call

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                    "properties": {"x": {"type": "integer"}}}}}


def test_text_needs_no_grammar():
    assert plan(None, None, None) is None and plan({"type": "text"}, None, None) is None
    assert plan(None, [TOOL], "none") is None  # tools offered but not to be called


def test_json_modes_and_tool_calls_get_a_grammar():
    assert "object" in plan({"type": "json_object"}, None, None).grammar
    schema = plan({"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object", "properties": {
        "city": {"type": "string"}}, "required": ["city"]}}}, None, None)
    assert "city" in schema.grammar and not schema.tool_call
    call = plan(None, [TOOL], "required")
    assert call.tool_call and '\\"f\\"' in call.grammar and "f:" in call.system_note


@pytest.mark.parametrize("args, param, code", [
    (({"type": "xml"}, None, None), "response_format.type", "invalid_request"),
    (({"type": "json_schema"}, None, None), "response_format.json_schema", "invalid_request"),
    (({"type": "json_schema", "json_schema": {"schema": {"$ref": "#/missing"}}}, None, None),
     "response_format.json_schema.schema", "invalid_schema"),
    ((None, [TOOL], None), "tool_choice", "unsupported_value"),
    ((None, [TOOL], "auto"), "tool_choice", "unsupported_value"),
    ((None, [{"type": "retrieval"}], "required"), "tools[0].type", "invalid_request"),
    ((None, [TOOL, TOOL], "required"), "tools[1].function.name", "invalid_request"),
    ((None, [TOOL], {"type": "function", "function": {"name": "g"}}), "tool_choice.function.name",
     "invalid_request"),
])
def test_what_cannot_be_served_is_a_400_naming_the_field(args, param, code):
    with pytest.raises(OpenAIError) as err:
        plan(*args)
    assert (err.value.status, err.value.param, err.value.code) == (400, param, code)


def test_a_tool_call_is_read_back_in_openai_shape():
    call = read_tool_call('{"name": "f", "arguments": {"x": 3}}')
    assert (call.name, json.loads(call.arguments)) == ("f", {"x": 3})
    cut = read_tool_call('{"name": "f", "arguments": {"x": ')  # cut at max_tokens: raw text kept, name found
    assert (cut.name, cut.arguments) == ("f", '{"name": "f", "arguments": {"x": ')
    assert cut.as_openai()["type"] == "function"
