"""bench/bfcl's parts: BFCL's cases as OpenAI tools the edge accepts, and BFCL's own checker judging answers."""

from __future__ import annotations

import pytest

from bench.bfcl.cases import load_cases, to_tool
from bench.bfcl.checker import check
from tiergate.edge_node.server.structured import plan


def test_a_bfcl_function_becomes_an_openai_tool_with_json_schema_types():
    tool = to_tool({"name": "math.hypot", "description": "d", "parameters": {"type": "dict", "properties": {
        "x": {"type": "float"}, "pair": {"type": "tuple", "items": {"type": "integer"}}, "v": {"type": "any"},
        "opts": {"type": "dict", "properties": {"deep": {"type": "float"}}}}, "required": ["x"]}})
    fn = tool["function"]
    assert fn["name"] == "math_hypot"
    props = fn["parameters"]["properties"]
    assert fn["parameters"]["type"] == "object" and props["x"] == {"type": "number"}
    assert props["pair"] == {"type": "array", "items": {"type": "integer"}} and props["v"] == {}
    assert props["opts"]["properties"]["deep"] == {"type": "number"}


def test_bfcls_checker_judges_real_cases():
    (case,) = load_cases("simple_python", 1)  # the triangle: base 10, height 5
    name = case.tools()[0]["function"]["name"]
    assert check(case, [{name: {"base": 10, "height": 5}}]).right
    wrong = check(case, [{name: {"base": 10, "height": 6}}])
    assert not wrong.right and "height" in wrong.why
    assert not check(case, []).right
    (irrelevant,) = load_cases("irrelevance", 1)
    assert check(irrelevant, []).right and not check(irrelevant, [{"anything": {}}]).right


@pytest.mark.parametrize("category", ["simple_python", "multiple", "parallel", "irrelevance"])
def test_every_case_of_the_run_is_a_tool_list_the_edge_accepts(category):
    """The edge node compiles each tool list to a grammar (a 400 for a schema it cannot take): BFCL's must all pass,
    or the run would measure refusals instead of tool calling."""
    for case in load_cases(category, 30):
        for mode in ("auto", "required"):
            assert plan(None, case.tools(), mode) is not None
