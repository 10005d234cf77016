import dataclasses

import pytest

from tests.cache.helpers import RULE, answer, chat, completion
from tiergate.cache.keys import (
    DEFAULT_TEMPERATURE,
    Route,
    answer_fits,
    asks_logprobs,
    effective_temperature,
    normalize_text,
    request_key,
    tenant_tag,
    uncacheable_reason,
)
from tiergate.core.types import Cascade, Decision
from tiergate.core.wire import ChatRequest, ContentPart, Message


def test_exact_key_ignores_whitespace_noise_but_not_case() -> None:
    k1 = request_key(chat("What is Rust?\r\n"), "t")
    k2 = request_key(chat("What is Rust?   "), "t")
    k3 = request_key(chat("what is rust?"), "t")
    assert k1.entry_id == k2.entry_id
    assert k1.entry_id != k3.entry_id


@pytest.mark.parametrize(
    "other",
    [
        {"tenant": "other"},
        {"model": "tiergate-cloud"},
        {"temperature": 0.2},
        {"top_p": 0.5},
        {"seed": 7},
        {"stop": ["\n"]},
        {"system": "You answer in French."},
        {"response_format": {"type": "json_object"}},
    ],
)
def test_namespace_changes_with_what_changes_answers(other: dict) -> None:
    tenant = other.pop("tenant", "t")
    base = request_key(chat("What is Rust?"), "t")
    changed = request_key(chat("What is Rust?", **other), tenant)
    assert changed.namespace != base.namespace
    assert changed.entry_id != base.entry_id


def test_namespace_ignores_what_does_not_change_answers() -> None:
    base = request_key(chat("What is Rust?"), "t")
    for params in ({"stream": True}, {"user": "u-123"}, {"max_tokens": 50}):
        k = request_key(chat("What is Rust?", **params), "t")
        assert (k.namespace, k.entry_id) == (base.namespace, base.entry_id)


def test_entry_id_starts_with_the_tenant_tag() -> None:
    k = request_key(chat("hi"), "acme")
    assert k.entry_id.startswith(tenant_tag("acme") + "-")
    assert tenant_tag("acme") != tenant_tag("acme2")


def test_chat_matches_the_last_user_message_under_its_context() -> None:
    k = request_key(chat("What is Rust?", system="Be brief."), "t")
    assert k.text == "What is Rust?" and k.semantic_ok
    ends_with_assistant = ChatRequest(model="m", temperature=0, messages=[
        Message(role="user", content="hi"), Message(role="assistant", content="Hello")])
    k2 = request_key(ends_with_assistant, "t")
    assert not k2.semantic_ok and k2.text == ""


def _about_image(url: str, *, earlier: bool = False) -> ChatRequest:
    image = Message(role="user", content=[ContentPart(type="text", text="What is in this picture?"),
                                          ContentPart(type="image_url", image_url={"url": url})])
    if earlier:  # the image in an earlier turn, then a text-only question about it
        return ChatRequest(model="m", temperature=0, messages=[
            image, Message(role="assistant", content="A cat."), Message(role="user", content="What colour?")])
    return ChatRequest(model="m", temperature=0, messages=[image])


@pytest.mark.parametrize("earlier", [False, True])
def test_questions_about_different_images_never_share_a_key(earlier: bool) -> None:
    a = request_key(_about_image("https://example.com/cat.png", earlier=earlier), "t")
    b = request_key(_about_image("https://example.com/dog.png", earlier=earlier), "t")
    again = request_key(_about_image("https://example.com/cat.png", earlier=earlier), "t")
    assert a.entry_id != b.entry_id
    assert a.entry_id == again.entry_id


def test_text_only_messages_keep_their_keys_when_split_into_parts() -> None:
    parts = ChatRequest(model="m", temperature=0, messages=[
        Message(role="system", content=[ContentPart(type="text", text="Be brief.")]),
        Message(role="user", content="What is Rust?")])
    plain = ChatRequest(model="m", temperature=0, messages=[
        Message(role="system", content="Be brief."), Message(role="user", content="What is Rust?")])
    assert request_key(parts, "t").entry_id == request_key(plain, "t").entry_id


def test_completion_prompts() -> None:
    assert request_key(completion("Once upon a time"), "t").text == "Once upon a time"
    assert request_key(completion(["Once upon a time"]), "t").text == "Once upon a time"
    assert uncacheable_reason(completion(["a", "b"]), RULE) == "batch_prompt"


def test_missing_temperature_counts_as_the_openai_default() -> None:
    req = chat("hi", temperature=None)
    assert effective_temperature(req) == DEFAULT_TEMPERATURE == 1.0
    assert uncacheable_reason(req, RULE) == "temperature"
    assert uncacheable_reason(req, dataclasses.replace(RULE, max_temperature=1.0)) is None


@pytest.mark.parametrize(
    ("params", "reason"),
    [
        ({"temperature": 0.9}, "temperature"),
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({}, None),
    ],
)
def test_uncacheable_reasons(params: dict, reason: str | None) -> None:
    assert uncacheable_reason(chat("hi", **params), RULE) == reason
    assert uncacheable_reason(chat("hi"), dataclasses.replace(RULE, enabled=False)) == "disabled"


def test_an_answer_fits_a_budget_it_finished_within() -> None:
    done = answer(completion_tokens=20)
    cut = answer(finish_reason="length", completion_tokens=50)
    assert answer_fits(done, 100, 30) and answer_fits(done, 100, None)
    assert not answer_fits(done, 100, 10)
    assert answer_fits(cut, 50, 50) and not answer_fits(cut, 50, 200) and not answer_fits(cut, 50, None)


def test_normalize_text_handles_junk() -> None:
    assert normalize_text("\ud800x") == "\ufffdx"
    assert normalize_text("  a  \n\n") == "a"
    assert request_key(chat("\x00\ud800"), "\ud800").entry_id  # no exception


# -- the routing decision, the asker's name, log-probabilities (issue 39, item 4) ------------------------------
def test_the_decided_tiers_are_part_of_the_namespace() -> None:
    edge, cloud = Route(("edge",), 32), Route(("cloud",), 32)
    a, b = request_key(chat("Explain step by step"), "t", edge), request_key(chat("Explain step by step"), "t", cloud)
    assert a.namespace != b.namespace and a.entry_id != b.entry_id
    assert (a.tiers, b.tiers) == (("edge",), ("cloud",))
    assert request_key(chat("Explain step by step"), "t", edge).entry_id == a.entry_id  # stable
    assert request_key(chat("hi"), "t").tiers is None  # not routed: the cache used alone (CLI, benchmarks)


def test_a_route_names_the_cascade_tier_too() -> None:
    plain = Decision(rule="default", tier="edge")
    cascade = Decision(rule="cascade", tier="edge", cascade=Cascade(escalate_to="cloud"))
    assert Route.of(plain, 4) == Route(("edge",), 4)
    assert Route.of(cascade, None) == Route(("edge", "cloud"), None)
    assert request_key(chat("q"), "t", Route.of(plain, 4)).namespace != \
        request_key(chat("q"), "t", Route.of(cascade, 4)).namespace


def test_the_effective_budget_is_the_keys_budget() -> None:
    """The client asked for 32, a cap made it 4: the answer is produced (and kept) under 4."""
    capped = request_key(chat("Explain TCP", max_tokens=32), "t", Route(("edge",), 4))
    uncapped = request_key(chat("Explain TCP", max_tokens=32), "t", Route(("edge",), 32))
    assert capped.max_tokens == 4 and uncapped.max_tokens == 32
    assert capped.entry_id == uncapped.entry_id  # one entry; `answer_fits` decides which budget it serves
    cut = answer(finish_reason="length", completion_tokens=4)
    assert answer_fits(cut, capped.max_tokens, capped.max_tokens)
    assert not answer_fits(cut, capped.max_tokens, uncapped.max_tokens)


def test_the_last_user_messages_name_is_part_of_the_namespace() -> None:
    def asked_by(name: str | None) -> ChatRequest:
        return ChatRequest(model="m", temperature=0, messages=[Message(role="user", content="What is my name?",
                                                                       name=name)])

    keys = {request_key(asked_by(n), "t").namespace for n in (None, "alice", "bob")}
    assert len(keys) == 3


@pytest.mark.parametrize(
    "req",
    [
        completion("2+2=", logprobs=0),  # 0 still asks for the chosen tokens' log-probabilities
        completion("2+2=", logprobs=3),
        chat("hi", logprobs=True),
        chat("hi", logprobs=True, top_logprobs=0),
        chat("hi", top_logprobs=0),
    ],
)
def test_log_probabilities_asked_for_in_any_form_bypass(req) -> None:
    assert asks_logprobs(req)
    assert uncacheable_reason(req, RULE) == "logprobs"


@pytest.mark.parametrize("req", [completion("2+2="), chat("hi"), chat("hi", logprobs=False)])
def test_no_log_probabilities_asked_for(req) -> None:
    assert not asks_logprobs(req) and uncacheable_reason(req, RULE) is None
