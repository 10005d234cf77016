"""The policy's `model_aliases`: client model names mapped to `auto` or a tier, with located errors."""

from __future__ import annotations

import pytest

from tests.policies.conftest import BASE
from tiergate.policies.loader import PolicyError, parse_policy

ALIASES = """\
model_aliases:
  gpt-4o-mini: auto
  "claude-3-5-haiku-*": edge
  "claude-*": cloud
  "*": auto
"""


def test_exact_names_win_then_globs_in_file_order() -> None:
    policy = parse_policy(BASE + ALIASES)
    assert policy.resolve_model("gpt-4o-mini") == "auto"
    assert policy.resolve_model("claude-3-5-haiku-latest") == "tiergate-edge"
    assert policy.resolve_model("claude-opus-4-8") == "tiergate-cloud"
    assert policy.resolve_model("anything-else") == "auto"
    assert policy.alias_for("claude-opus-4-8") == ("claude-*", "cloud")
    assert policy.resolve_model("tiergate-edge") == "tiergate-edge"  # a tier's own name is never aliased
    assert policy.alias_for("auto") is None and policy.alias_for("tiergate-cloud") is None


def test_globs_are_case_sensitive_and_no_alias_leaves_the_name_alone() -> None:
    policy = parse_policy(BASE + 'model_aliases:\n  "claude-*": cloud\n')
    assert policy.resolve_model("Claude-opus") == "Claude-opus"
    assert parse_policy(BASE).resolve_model("gpt-4o") == "gpt-4o"


def _line(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.mark.parametrize("aliases, needle, words", [
    ('  "claude-*": nowhere\n', "claude-*", "neither `auto` nor a tier"),
    ("  tiergate-cloud: edge\n", "tiergate-cloud: edge", "own model name"),
    ("  auto: edge\n", "auto: edge", "never `auto`"),
    ("  gpt-4o: [edge]\n", "gpt-4o", "string"),
])
def test_bad_aliases_name_file_line_and_field(aliases, needle, words) -> None:
    text = BASE + "model_aliases:\n" + aliases
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "p.yaml")
    shown = str(info.value)
    assert f"p.yaml:{_line(text, needle)}:" in shown and "model_aliases" in shown and words in shown, shown
