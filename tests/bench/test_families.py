"""bench/families.py: the checkers accept the cloud's sentence and refuse wrong answers, and the held-out split
shares no question value and no held-out phrasing with training (no model, no server)."""

from __future__ import annotations

import itertools

import pytest

from bench.cascade.capitals import CAPITALS
from bench.families import (
    FAMILIES,
    HELDOUT_PHRASINGS,
    Family,
    all_training,
    heldout,
    is_heldout_value,
    training_stream,
)


@pytest.fixture(scope="module")
def training():
    return all_training()


@pytest.fixture(scope="module")
def held():
    return heldout(40)


def test_every_question_accepts_its_own_reply_and_refuses_others(training, held) -> None:
    qs = [*held, *(q for fam in training.values() for q in fam[:200])]
    for q in qs:
        assert q.check(q.reply), (q.prompt, q.reply)
        assert not q.check("I am not sure."), q.prompt
        assert not q.check(q.prompt), q.prompt  # restating the question is no answer
    by_family: dict[str, list] = {}
    for q in held:
        by_family.setdefault(q.task, []).append(q)
    for fam in by_family.values():  # another question's reply of the same family is wrong for this one
        for a, b in itertools.pairwise(fam):
            if a.gold != b.gold:
                assert not a.check(b.reply), (a.prompt, b.reply)


@pytest.mark.parametrize(("family", "answer", "right"), [
    ("arithmetic", "47 plus 25 is 72.", True),
    ("arithmetic", "47 + 25 = 72", True),
    ("arithmetic", "The answer is 71.", False),
    ("arithmetic", "72 or 73", False),
])
def test_number_checker_on_a_known_question(family, answer, right) -> None:
    side = heldout(10_000, families=[Family.ARITHMETIC]) if is_heldout_value("add-47-25") \
        else all_training()[Family.ARITHMETIC]
    q = next(q for q in side if q.value == "add-47-25")
    assert q.task == family and q.check(answer) is right


def test_capital_checker_wants_the_capital_and_no_other() -> None:
    q = next(q for q in [*all_training()[Family.CAPITAL], *heldout(200, families=[Family.CAPITAL])]
             if q.value == "France")
    assert q.check("Paris.") and q.check("The capital of France is Paris.")
    assert not q.check("Lyon") and not q.check("Paris or Berlin")


def test_faq_checker_wants_the_key_fact() -> None:
    q = next(q for q in all_training()[Family.FAQ] if q.value == "trash-days")
    assert q.check("Deleted files stay in the trash for 30 days.")
    assert not q.check("Deleted files stay in the trash for 3 days.") and not q.check("30 day")


def test_heldout_values_and_phrasings_never_appear_in_training(training, held) -> None:
    train_values = {(q.task, q.value) for fam in training.values() for q in fam}
    train_prompts = {q.prompt for fam in training.values() for q in fam}
    assert all(q.phrasing not in HELDOUT_PHRASINGS for fam in training.values() for q in fam)
    for q in held:
        assert q.prompt not in train_prompts, q.prompt
        if q.task == Family.FAQ.value:  # the FAQ's entries are the knowledge: held out by wording instead
            assert q.phrasing in HELDOUT_PHRASINGS
        else:
            assert (q.task, q.value) not in train_values, q.value
            assert is_heldout_value(q.value)


def test_heldout_covers_every_family_with_distinct_values_and_unseen_phrasings(held) -> None:
    assert {q.task for q in held} == {f.value for f in FAMILIES}
    for fam in FAMILIES:
        qs = [q for q in held if q.task == fam.value]
        assert len(qs) == 40
        if fam is Family.CAPITAL:  # fewer held-out countries than questions: the rest are other phrasings
            countries = sum(is_heldout_value(c) for c, *_ in CAPITALS)
            assert len({q.value for q in qs}) == countries < 40
        elif fam is not Family.FAQ:
            assert len({q.value for q in qs}) == 40
        assert any(q.phrasing in HELDOUT_PHRASINGS for q in qs)
    assert heldout(40) == held  # the same seed gives the same questions


def test_training_stream_draws_only_training_questions_from_every_family(training) -> None:
    stream = training_stream(500, seed=3)
    assert len(stream) == 500 and stream == training_stream(500, seed=3)
    allowed = {q.prompt for fam in training.values() for q in fam}
    assert all(q.prompt in allowed for q in stream)
    assert {q.task for q in stream} == {f.value for f in FAMILIES}
