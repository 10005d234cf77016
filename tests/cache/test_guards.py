import pytest

from tiergate.cache.guards import GUARDS, overlap, signature, veto


def judge(a: str, b: str) -> str | None:
    return veto(signature(a), signature(b))


@pytest.mark.parametrize(
    ("a", "b", "guard"),
    [
        ("What major events happened in 2002?", "What major events happened in 1992?", "numbers"),
        ("If you could keep only five possessions?", "If you could keep only three possessions?", "numbers"),
        ("Round 1 of TCS Codevita", "Round 2 of TCS Codevita", "numbers"),
        ("Why is my code not compiling?", "Why is my code compiling?", "negation"),
        ("Why doesn't the app start?", "Why does the app start?", "negation"),
        ("Rehab center near Boone County, Arkansas?", "Rehab center near Garland County, Arkansas?", "keywords"),
        ("How does it compare to C#?", "How does it compare to C++?", "keywords"),
        ("How is Messi better than Ronaldo?", "How is Ronaldo better than Messi?", "order"),
        ("convert a string to an integer in JS", "convert an integer to a string in JS", "order"),
        ("How do you convert kilometers to miles?", "How do you convert miles to kilometers?", "order"),
        # issue 39: opposites the embedder puts at cosine 0.95-0.99
        ("What is the maximum daily dose of acetaminophen for adults?",
         "What is the minimum daily dose of acetaminophen for adults?", "opposites"),
        ("Is it legal to drive barefoot in California?", "Is it illegal to drive barefoot in California?",
         "opposites"),
        ("Is it safe to eat raw cookie dough?", "Is it unsafe to eat raw cookie dough?", "opposites"),
        ("Should I take ibuprofen before meals?", "Should I take ibuprofen after meals?", "opposites"),
        ("How do I sort a list in ascending order?", "How do I sort a list in descending order?", "opposites"),
        ("How can I increase my metabolism?", "How can I decrease my metabolism?", "opposites"),
        ("Which foods increased his blood pressure?", "Which foods decreased his blood pressure?", "opposites"),
        ("Is it possible to run Windows apps on a Mac?", "Is it impossible to run Windows apps on a Mac?",
         "opposites"),
        ("How do I install Docker on Ubuntu?", "How do I uninstall Docker on Ubuntu?", "opposites"),
        ("Is a dishonest answer ever right?", "Is an honest answer ever right?", "opposites"),
        ("Which is the highest mountain in Europe?", "Which is the lowest mountain in Europe?", "opposites"),
        ("Is the max heap size set by -Xmx?", "Is the min heap size set by -Xmx?", "opposites"),
        ("Are you allowed to drive over the speed limit?", "Are you allowed to drive under the speed limit?",
         "opposites"),
        ("Can I drink coffee with milk?", "Can I drink coffee without milk?", "negation"),
        ("Can I drink coffee?", "I cannot drink coffee?", "negation"),
    ],
)
def test_known_false_hit_kinds_are_vetoed(a: str, b: str, guard: str) -> None:
    assert judge(a, b) == guard
    assert judge(b, a) == guard  # symmetric


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("How do I invest my money wisely?", "How can I invest my money wisely?"),
        ("Which app is best for WhatsApp backups?", "which app is best for whatsapp backups"),
        ("What is the capital of France?", "Tell me the capital of France."),
        ("How can I lose weight fast?", "What is the fastest way to lose weight?"),
        ("Is 2 + 2 equal to 4?", "Is 2+2 equal to 4?"),
        ("What is 1,000 times three?", "What is 1000 times 3?"),
        ("Is it legal or illegal to own a fox?", "Is owning a fox illegal or legal?"),  # both words on both sides
        ("How do I get a discount on flights?", "How do I count flights?"),  # a noun that only looks prefixed
        ("How do I invest in stocks?", "How do I vest stocks?"),
    ],
)
def test_paraphrases_pass(a: str, b: str) -> None:
    assert judge(a, b) is None


def test_a_capitalised_first_word_is_not_a_name() -> None:
    assert signature("Where is the station?").keywords == frozenset()
    assert "london" in signature("Where is London?").keywords
    assert "nasa" in signature("NASA launches").keywords  # ALL-CAPS counts even at the start


def test_only_enabled_guards_apply() -> None:
    a, b = signature("happened in 2002"), signature("happened in 1992")
    assert veto(a, b, ()) is None
    assert veto(a, b, ("negation",)) is None
    assert veto(a, b, GUARDS) == "numbers"


@pytest.mark.parametrize("text", ["", "   ", "\x00\x01\x02", "\ud800 broken surrogate", "🙂" * 50, "a" * 100_000])
def test_odd_text_never_raises(text: str) -> None:
    sig = signature(text)
    assert veto(sig, signature("hello")) in (None, *GUARDS)


def test_overlap_is_the_share_of_content_words_in_common() -> None:
    a = signature("How do I invest my money wisely?")
    assert overlap(a, signature("How can I invest my money wisely?")) == 1.0  # only stop words differ
    assert overlap(a, signature("How do I spend my money?")) == pytest.approx(1 / 4)  # money of invest/money/wisely/spend
    assert overlap(signature("Is it?"), signature("Is it?")) == 1.0  # no content words on either side
    assert overlap(a, signature("What is it?")) == 0.0


def test_opposites_come_from_wordnet_and_negating_prefixes() -> None:
    from tiergate.cache.lexicon import lexicon

    lex = lexicon()
    assert "minimum" in lex.opposites("maximum") and "illegal" in lex.opposites("legal")  # WordNet's antonyms
    assert "safe" in lex.opposites("unsafe")  # an adjective with a negating prefix (WordNet misses this one)
    assert "install" in lex.opposites("uninstall")  # a word WordNet does not know: the prefix decides
    assert "count" not in lex.opposites("discount")  # a noun WordNet knows: not a negation
    assert "after" in lex.opposites("before")  # prepositions: not in WordNet, listed
    assert {"decrease", "decreased"} <= lex.forms("decreased") and "high" in lex.forms("highest")
