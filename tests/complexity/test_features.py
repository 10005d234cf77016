"""The conversation featurizer: what is asked for, the conversation's parts, and the one WordPiece pass."""

from __future__ import annotations

import pytest

from tiergate.complexity.encoder import MAX_CHARS
from tiergate.complexity.features import (
    CONTENT,
    CUES,
    FEATURES,
    Featurizer,
    as_messages,
    cue_counts,
    last_user_text,
)
from tiergate.complexity.tokens import TokenCounter


@pytest.fixture(scope="module")
def featurizer() -> Featurizer:
    return Featurizer()


def named(f: Featurizer, messages) -> dict[str, float]:
    return dict(zip(FEATURES, f(as_messages(messages)).values, strict=True))


def cues(text: str) -> dict[str, int]:
    return dict(zip(CUES, cue_counts(text), strict=True))


@pytest.mark.parametrize("text,family", [
    ("Write a Python function that reverses a list", "code"),
    ("Fix the bug in this SQL query", "code"),
    ("What is 37 * 41?", "math"),
    ("Find the derivative of x^2", "math"),
    ("Prove that there are infinitely many primes", "proof"),
    ("Show that the sum of two odd numbers is even", "proof"),
    ("Write an essay of 500 words on rivers", "long_output"),
    ("Answer in exactly three bullet points and do not mention dogs", "constraints"),
    ("Explain step by step why the sky is blue", "reasoning"),
    ("What are the pros and cons of renting versus buying?", "comparison"),
    ("Compose a haiku about autumn", "creative"),
    ("Who was the first emperor of Rome?", "lookup"),
    ("Can a patient take this drug with alcohol?", "domain"),
])
def test_cues_find_what_is_asked_for(text, family):
    assert cues(text)[family] > 0


def test_cues_are_whole_words_and_phrases():
    assert cues("a classic classroom")["code"] == 0  # "class" inside other words does not count
    assert cues("Show that it holds")["proof"] == 1 and cues("show me that picture")["proof"] == 0
    assert cues("3+4 and 10 / 2")["math"] == 2  # arithmetic counts as math without any math word


def test_a_bare_prompt_is_one_user_message_and_content_parts_are_joined():
    assert as_messages("hi") == [("user", "hi")] == as_messages({"prompt": "hi"})
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}, {"text": "b"}]}]
    assert as_messages({"messages": parts}) == [("user", "a\nb")]
    assert as_messages([{"role": "system", "content": None}]) == [("system", "")]


def test_the_last_user_message_is_what_is_read(featurizer):
    msgs = [("system", "You are terse."), ("user", "Write a Python function to sort a list."),
            ("assistant", "def f(x): return sorted(x)"), ("user", "Thanks! What is the capital of France?")]
    assert last_user_text(msgs) == "Thanks! What is the capital of France?"
    f = named(featurizer, msgs)
    assert f["cue_code"] == 0 and f["cue_lookup"] > 0
    assert f["log_tokens_system"] > 0 and f["log_tokens_history"] > 0
    assert f["log_turns"] > named(featurizer, msgs[-1:])["log_turns"]


def test_context_changes_the_length_features_only(featurizer):
    question = "Compare merge sort and quicksort in a table."
    alone = featurizer([("user", question)]).values
    system = featurizer([("system", "You are a helpful assistant. " * 40), ("user", question)]).values
    content = [FEATURES[i] for i in CONTENT]
    for name in content:
        assert alone[FEATURES.index(name)] == system[FEATURES.index(name)], name
    assert system[FEATURES.index("log_tokens")] > alone[FEATURES.index("log_tokens")]
    assert set(FEATURES) - set(content) == {"log_tokens", "log_tokens_system", "log_tokens_history", "log_turns"}


def test_lettered_options_are_counted_and_lower_case_lists_are_not(featurizer):
    assert named(featurizer, "Pick one:\nA. red\nB. blue\nC) green")["options"] > 0
    assert named(featurizer, "Steps:\na. mix\nb. bake")["options"] == 0


def test_one_pass_counts_what_the_token_counter_counts(featurizer):
    counter = TokenCounter()
    msgs = [("system", "Be brief."), ("user", "naïve café: ünïcode and ASCII"), ("assistant", ""), ("user", "ok?")]
    got = featurizer(msgs)
    assert got.exact and got.text_tokens == sum(counter.count_texts([t for _, t in msgs]))
    assert got.last_text == "ok?" and got.last_ids == featurizer.encoder.encode("ok?")


def test_a_message_longer_than_the_analysed_prefix_is_flagged(featurizer):
    got = featurizer([("user", "word " * (MAX_CHARS // 4))])
    assert not got.exact and len(got.last_text) == MAX_CHARS


@pytest.mark.parametrize("messages", [[], [("assistant", "only an answer")], [("user", "")], "日本語のテキスト",
                                      "\x00\x07", "x" * 50_000])
def test_any_conversation_gives_finite_numbers(featurizer, messages):
    values = featurizer(as_messages(messages) if isinstance(messages, str) else messages).values
    assert len(values) == len(FEATURES) and all(isinstance(v, float) and v == v and abs(v) < 1e6 for v in values)
