"""What structured output asks of the decoder: a grammar for JSON, schemas and tool calls; 400s naming the field."""

from __future__ import annotations

import enum
import json

import openai
import pytest
from pydantic import BaseModel

from tiergate.core.errors import OpenAIError
from tiergate.edge_node.server.structured import inline_refs, plan, read_tool_call, read_tool_calls

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
    ((None, [TOOL], "sometimes"), "tool_choice", "invalid_request"),
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


def test_tool_choice_auto_lets_the_model_answer_in_text_or_call_a_tool():
    for choice in (None, "auto"):  # no tool_choice with tools means auto
        auto = plan(None, [TOOL], choice)
        assert auto is not None and auto.auto and not auto.tool_call and auto.parallel
        rules = dict(line.split(" ::= ", 1) for line in auto.grammar.splitlines())
        assert rules["root"].startswith("tool-call | ") and rules["root"].endswith(" | text")
        assert '"[" space tool-call' in rules["root"]  # parallel calls (OpenAI's default) as a JSON array
        assert rules["text"].startswith("[^{[ ")  # text cannot look like a call: its first character decides
        assert "plain text" in auto.system_note and "f:" in auto.system_note
    single = plan(None, [TOOL], "auto", parallel_tool_calls=False)
    assert not single.parallel and " | text" in single.grammar and '"["' not in single.grammar.split("root ::=")[1]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "f"}}],
                         ids=["required", "named"])
def test_required_and_named_calls_may_be_several_unless_parallel_calls_are_off(choice):
    several = plan(None, [TOOL], choice)  # parallel_tool_calls left out: OpenAI's default, true
    rules = dict(line.split(" ::= ", 1) for line in several.grammar.splitlines())
    assert several.tool_call and several.parallel
    assert rules["root"] == 'tool-call | "[" space tool-call ("," space tool-call)* "]" space'  # one or more
    assert '\\"f\\"' in several.grammar and "JSON array" in several.system_note
    one = plan(None, [TOOL], choice, parallel_tool_calls=False)
    rules = dict(line.split(" ::= ", 1) for line in one.grammar.splitlines())
    assert one.tool_call and not one.parallel and "tool-call" not in rules and '"["' not in rules["root"]
    assert "JSON array" not in one.system_note


def test_the_first_character_tells_a_call_from_text():
    auto = plan(None, [TOOL], None)
    assert auto.is_call('{"name": "f", "arguments": {}}') and auto.is_call(' [{"name": "f"')
    assert not auto.is_call("Paris is sunny.") and not auto.is_call("")
    single = plan(None, [TOOL], None, parallel_tool_calls=False)
    assert not single.is_call("[1] is a footnote") and single.is_call("{")
    assert plan(None, [TOOL], "required").is_call("")  # required: whatever it is, it is a call


def test_parallel_calls_are_read_back_as_a_list():
    calls = read_tool_calls('[{"name": "f", "arguments": {"x": 1}}, {"name": "g", "arguments": {}}]')
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("f", {"x": 1}), ("g", {})]
    [one] = read_tool_calls('{"name": "f", "arguments": {"x": 2}}')
    assert (one.name, json.loads(one.arguments)) == ("f", {"x": 2})
    [cut] = read_tool_calls('[{"name": "f", "argu')
    assert cut.name == "f" and cut.arguments == '[{"name": "f", "argu'


class Unit(enum.Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


class Place(BaseModel):
    city: str
    country: str


class GetWeather(BaseModel):
    """Current weather of a place."""

    place: Place
    unit: Unit


def test_a_pydantic_tool_with_defs_gets_a_grammar_with_its_refs_inlined():
    tool = openai.pydantic_function_tool(GetWeather)
    params = tool["function"]["parameters"]
    assert "$defs" in params and '"$ref"' in json.dumps(params)  # what the SDK sends
    inlined = inline_refs(params, "GetWeather", "tools[0].function.parameters")
    assert "$ref" not in json.dumps(inlined) and "$defs" not in inlined
    assert inlined["properties"]["unit"]["enum"] == ["celsius", "fahrenheit"]
    assert inlined["properties"]["place"]["required"] == ["city", "country"]
    for choice in ("required", "auto"):
        grammar = plan(None, [tool], choice).grammar
        assert '\\"celsius\\"' in grammar and '\\"country\\"' in grammar


def test_inlining_keeps_keywords_beside_a_ref_and_follows_any_local_pointer():
    schema = {"type": "object", "definitions": {"D": {"type": "integer"}},
              "properties": {"a": {"$ref": "#/definitions/D", "description": "kept"},
                             "b": {"$ref": "#/properties/a"},
                             "definitions": {"type": "string"}}}  # a property may be called that
    got = inline_refs(schema, "t", "p")
    assert got["properties"]["a"] == {"type": "integer", "description": "kept"}
    assert got["properties"]["b"] == {"type": "integer", "description": "kept"}
    assert got["properties"]["definitions"] == {"type": "string"} and "definitions" not in got


@pytest.mark.parametrize("params, code, words", [
    ({"$defs": {"Node": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}},
      "$ref": "#/$defs/Node"}, "unsupported_value", "cyclic `$ref` (#/$defs/Node -> #/$defs/Node)"),
    ({"type": "object", "properties": {"me": {"$ref": "#"}}}, "unsupported_value", "cyclic"),
    ({"type": "object", "properties": {"u": {"$ref": "#/$defs/Unit"}}}, "invalid_schema", "points nowhere"),
    ({"type": "object", "properties": {"u": {"$ref": "https://example.com/s.json"}}}, "invalid_schema",
     "only references inside"),
])
def test_refs_the_node_cannot_resolve_are_400s_naming_the_tool(params, code, words):
    tool = {"type": "function", "function": {"name": "tree", "parameters": params}}
    with pytest.raises(OpenAIError) as err:
        plan(None, [TOOL, tool], "auto")
    e = err.value
    assert (e.status, e.code, e.param) == (400, code, "tools[1].function.parameters")
    assert "'tree'" in e.message and words in e.message


def test_parameters_nested_past_the_stack_are_a_400_not_a_crash():
    deep: dict = {"type": "object"}
    for _ in range(5000):
        deep = {"type": "array", "items": deep}
    with pytest.raises(OpenAIError) as err:
        inline_refs(deep, "t", "tools[0].function.parameters")
    assert (err.value.code, err.value.param) == ("invalid_schema", "tools[0].function.parameters")
