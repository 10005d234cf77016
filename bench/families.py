"""Task families with exact checkers, a training stream and a held-out split: the traffic of bench/flywheel.

Four families an operator's edge could learn from the cloud: two-digit sums and differences, unit conversions
(whole-number factors), capitals of countries, and the FAQ of an invented product ("Quillbox", a file-sync
service: our own data, written for this project). Every family is asked in several phrasings, and every
question has one gold answer and the sentence a cloud tier would answer it with (`reply`).

The held-out split is by what is asked, never by row: a stable hash of the question's value (the numbers, the
unit and amount, the country) puts a value wholly on one side, so no paraphrase of a held-out question is ever
trained on; and each family keeps two phrasings (templates) out of training altogether. The FAQ is the
exception: its entries are the knowledge to learn, so its held-out questions ask trained entries in a wording
(and a framing) training never used. A later bench (bench/routing-loop) imports the same module.

Checkers (bench/cascade/check.py's rules): numbers are right when, after dropping the question's own numbers,
at least one number is left and all equal the gold; capitals when the gold capital and no other is named; FAQ
answers when the entry's key fact appears (normalised, whole words).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from bench.cascade.capitals import CAPITALS
from bench.cascade.check import EntityIndex, entity_right, normalise, number_right

__all__ = ["FAMILIES", "Family", "Question", "heldout", "is_heldout_value", "training_stream", "all_training"]


class Family(Enum):
    ARITHMETIC = "arithmetic"
    CONVERSION = "conversion"
    CAPITAL = "capital"
    FAQ = "faq"


FAMILIES = tuple(Family)
HELDOUT_SHARE = 0.25  # of question values (numbers, amounts, countries) never trained on
# Training traffic's mix: arithmetic has the most distinct questions, the FAQ the fewest.
MIX = {Family.ARITHMETIC: 0.35, Family.CONVERSION: 0.25, Family.CAPITAL: 0.25, Family.FAQ: 0.15}


@dataclass(frozen=True)
class Question:
    """One question: its prompt, the gold answer, the cloud's sentence for it, and the rule that checks an answer."""

    id: str
    task: str  # the family's value (bench/cascade's Item calls it task)
    value: str  # what is asked, independent of phrasing: the unit of the held-out split
    phrasing: int  # template index within the family
    prompt: str
    gold: str
    reply: str = field(compare=False)
    check: Callable[[str], bool] = field(repr=False, compare=False)


def _bucket(key: str) -> float:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64


def is_heldout_value(value: str) -> bool:
    """True for the question values the student never trains on (stable: a hash of the value)."""
    return _bucket("value:" + value) < HELDOUT_SHARE


# ------------------------------------------------------------------------------------------- arithmetic

_ADD = ("What is {a} plus {b}?", "Add {a} and {b}.", "Compute {a} + {b}.", "What do you get when you add {a} to {b}?",
        "How much is {a} + {b}?", "Tell me the sum of {a} and {b}.")
_SUB = ("What is {a} minus {b}?", "Subtract {b} from {a}.", "Compute {a} - {b}.",
        "What do you get when you take {b} away from {a}?", "How much is {a} - {b}?",
        "Tell me the difference between {a} and {b}.")
HELDOUT_PHRASINGS = (4, 5)  # in every family: templates never used in training


def _arith(op: str, a: int, b: int, k: int) -> Question:
    gold = a + b if op == "add" else a - b
    word = "plus" if op == "add" else "minus"
    prompt = (_ADD if op == "add" else _SUB)[k].format(a=a, b=b)
    return Question(f"arith-{op}-{a}-{b}-p{k}", Family.ARITHMETIC.value, f"{op}-{a}-{b}", k, prompt, str(gold),
                    f"{a} {word} {b} is {gold}.", lambda ans, g=gold, ops=(a, b): number_right(ans, g, ops))


def _arith_values() -> list[tuple[str, int, int]]:
    adds = [("add", a, b) for a in range(10, 100) for b in range(10, 100)]
    subs = [("sub", a, b) for a in range(20, 100) for b in range(10, a) if a - b >= 2]
    return adds + subs


# ------------------------------------------------------------------------------------------- conversions

_UNITS = (("hours", "minutes", 60), ("minutes", "seconds", 60), ("meters", "centimeters", 100),
          ("kilograms", "grams", 1000), ("feet", "inches", 12), ("days", "hours", 24), ("weeks", "days", 7),
          ("liters", "milliliters", 1000), ("kilometers", "meters", 1000), ("years", "months", 12))
_CONV = ("How many {to} are in {v} {frm}?", "Convert {v} {frm} to {to}.", "{v} {frm} is how many {to}?",
         "What is {v} {frm} in {to}?", "Express {v} {frm} in {to}.", "If I have {v} {frm}, how many {to} is that?")


def _conv(frm: str, to: str, factor: int, v: int, k: int) -> Question:
    gold = v * factor
    return Question(f"conv-{frm}-{to}-{v}-p{k}", Family.CONVERSION.value, f"{frm}-{to}-{v}", k,
                    _CONV[k].format(v=v, frm=frm, to=to), str(gold), f"{v} {frm} is {gold} {to}.",
                    lambda ans, g=gold, ops=(v, factor): number_right(ans, g, ops))


def _conv_values() -> list[tuple[str, str, int, int]]:
    return [(frm, to, f, v) for frm, to, f in _UNITS for v in range(2, 41)]


# ------------------------------------------------------------------------------------------- capitals

_CAPITAL_INDEX = EntityIndex({cap: aliases for _, cap, aliases, _ in CAPITALS})
_CAP = ("What is the capital of {x}?", "Name the capital city of {x}.", "Which city is the capital of {x}?",
        "What is {x}'s capital city?", "Tell me the capital of {x}.", "What city serves as the capital of {x}?")


def _capital(country: str, capital: str, k: int) -> Question:
    return Question(f"capital-{country}-p{k}", Family.CAPITAL.value, country, k, _CAP[k].format(x=country), capital,
                    f"The capital of {country} is {capital}.",
                    lambda ans, g=capital: entity_right(ans, g, _CAPITAL_INDEX))


# ------------------------------------------------------------------------------------------- the FAQ

# (key, three wordings of the question, the answer, the key fact an answer must contain). Quillbox is invented.
# A key fact never repeats words of its own questions: restating the question is not an answer.
_FAQ: tuple[tuple[str, tuple[str, str, str], str, str], ...] = (
    ("free-storage", ("How much storage does the Quillbox free plan include?",
                      "What is the storage limit on Quillbox's free plan?",
                      "How many gigabytes do I get with a free Quillbox account?"),
     "The Quillbox free plan includes 15 GB of storage.", "15 GB"),
    ("pro-price", ("How much does Quillbox Pro cost?", "What is the monthly price of Quillbox Pro?",
                   "What do I pay each month for a Quillbox Pro plan?"),
     "Quillbox Pro costs 9 dollars a month.", "9 dollars"),
    ("trash-days", ("How long does Quillbox keep deleted files?", "For how many days can I restore a deleted file "
                    "in Quillbox?", "When does Quillbox empty the trash for good?"),
     "Quillbox keeps deleted files in the trash for 30 days.", "30 days"),
    ("max-file", ("What is the largest file Quillbox can upload?", "Is there a file size limit in Quillbox?",
                  "How big can a single file be on Quillbox?"),
     "Quillbox uploads files of up to 50 GB each.", "50 GB"),
    ("versions", ("How many versions of a file does Quillbox keep?", "How far back does Quillbox's version "
                  "history go?", "For how long can I restore an older version of a file in Quillbox?"),
     "Quillbox keeps file versions for 180 days.", "180 days"),
    ("support-hours", ("When is Quillbox support available?", "What are the hours of Quillbox customer support?",
                       "At what times can I reach the Quillbox support team?"),
     "Quillbox support answers every day from 8 am to 8 pm.", "8 am to 8 pm"),
    ("sync-port", ("Which port does the Quillbox sync client use?", "What network port must be open for Quillbox "
                   "sync?", "On which port does Quillbox's desktop client connect?"),
     "The Quillbox sync client uses port 8443.", "8443"),
    ("devices-free", ("How many devices can I link on the free plan of Quillbox?", "What is the device limit for "
                      "a free Quillbox account?", "On how many computers can a free Quillbox user sync?"),
     "A free Quillbox account can link 3 devices.", "3 devices"),
    ("team-seats", ("What is the minimum number of seats for Quillbox Teams?", "How many users does a Quillbox "
                    "Teams plan need at least?", "What is the smallest team Quillbox Teams sells to?"),
     "Quillbox Teams starts at 5 seats.", "5 seats"),
    ("refund", ("What is Quillbox's refund policy?", "Can I get my money back after paying for Quillbox?",
                "How long do I have to ask Quillbox for a refund?"),
     "Quillbox refunds any payment within 14 days.", "14 days"),
    ("encryption", ("How does Quillbox encrypt my files?", "What encryption does Quillbox use for stored files?",
                    "Are my files encrypted at rest on Quillbox, and with what?"),
     "Quillbox encrypts stored files with AES-256.", "AES 256"),
    ("share-expiry", ("When do Quillbox share links expire?", "How long does a Quillbox shared link stay valid?",
                      "After how long does a link I share from Quillbox stop working?"),
     "Quillbox share links expire after 7 days.", "7 days"),
    ("password-reset", ("How do I reset my Quillbox password?", "I forgot my Quillbox password, what do I do?",
                        "Where can I change a lost Quillbox password?"),
     "Reset your Quillbox password under Settings, then Security.", "Settings then Security"),
    ("offline", ("Can I use Quillbox files offline?", "Does Quillbox work without an internet connection?",
                 "How do I open my Quillbox files when I am offline?"),
     "Mark a Quillbox folder as Available offline to open it without a connection.", "Available offline"),
    ("two-factor", ("Does Quillbox support two-factor authentication?", "How do I turn on 2FA in Quillbox?",
                    "Can I protect my Quillbox login with a second factor?"),
     "Turn on two-factor authentication in Quillbox under Settings, then Security.", "Settings then Security"),
    ("family-plan", ("How many people can share a Quillbox Family plan?", "What is the member limit of "
                     "Quillbox Family?", "How many family members fit on one Quillbox Family plan?"),
     "A Quillbox Family plan covers 6 people.", "6 people"),
    ("upload-speed", ("Does Quillbox limit upload speed?", "Is there a bandwidth cap for Quillbox uploads?",
                      "Will Quillbox slow down my uploads?"),
     "Quillbox does not limit upload speed.", "not limit"),
    ("data-center", ("Where does Quillbox store my data?", "In which country are Quillbox's servers?",
                     "Where are the data centers that hold Quillbox files?"),
     "Quillbox stores data in data centers in Ireland.", "Ireland"),
    ("cancel", ("How do I cancel my Quillbox subscription?", "Where can I end my paid Quillbox plan?",
                "What are the steps to stop paying for Quillbox?"),
     "Cancel your Quillbox subscription under Settings, then Billing.", "Settings then Billing"),
    ("linux", ("Is there a Quillbox client for Linux?", "Does Quillbox run on Ubuntu?",
               "Can I install the Quillbox desktop app on a Linux computer?"),
     "Quillbox has a desktop client for Linux.", "desktop client for Linux"),
    ("api-rate", ("What is the Quillbox API rate limit?", "How many API requests per minute does Quillbox allow?",
                  "How often can my script call the Quillbox API?"),
     "The Quillbox API allows 600 requests per minute.", "600 requests"),
    ("student", ("Does Quillbox have a student discount?", "Is Quillbox cheaper for students?",
                 "How much do students save on Quillbox Pro?"),
     "Students get 50 percent off Quillbox Pro.", "50 percent"),
)
_FAQ_WRAP_TRAIN = ("{q}", "Hi, {q}", "{q} Thanks!", "Quick question: {q}")
_FAQ_WRAP_HELD = ("Hello there. {q}", "Can you help me? {q}")
_FAQ_FACTS = {key: normalise(fact) for key, _, _, fact in _FAQ}


def _faq_right(answer: str, key: str) -> bool:
    return f" {_FAQ_FACTS[key]} " in f" {normalise(answer)} "


def _faq(entry: int, form: int, wrap: str, k: int) -> Question:
    key, forms, reply, fact = _FAQ[entry]
    return Question(f"faq-{key}-f{form}-p{k}", Family.FAQ.value, key, k, wrap.format(q=forms[form]), fact, reply,
                    lambda ans, kk=key: _faq_right(ans, kk))


# ------------------------------------------------------------------------------------------- the split


def all_training() -> dict[Family, list[Question]]:
    """Every distinct training question of each family: training values in training phrasings."""
    train_k = [k for k in range(6) if k not in HELDOUT_PHRASINGS]
    return {
        Family.ARITHMETIC: [_arith(op, a, b, k) for op, a, b in _arith_values()
                            if not is_heldout_value(f"{op}-{a}-{b}") for k in train_k],
        Family.CONVERSION: [_conv(frm, to, f, v, k) for frm, to, f, v in _conv_values()
                            if not is_heldout_value(f"{frm}-{to}-{v}") for k in train_k],
        Family.CAPITAL: [_capital(c, cap, k) for c, cap, _, _ in CAPITALS if not is_heldout_value(c)
                         for k in train_k],
        Family.FAQ: [_faq(e, form, w, k) for e in range(len(_FAQ)) for form in (0, 1)
                     for k, w in enumerate(_FAQ_WRAP_TRAIN)],
    }


def _all_heldout() -> dict[Family, list[Question]]:
    """Held-out values (any phrasing, half of them never trained); FAQ: trained entries, unseen wording."""
    return {
        Family.ARITHMETIC: [_arith(op, a, b, k) for op, a, b in _arith_values()
                            if is_heldout_value(f"{op}-{a}-{b}") for k in range(6)],
        Family.CONVERSION: [_conv(frm, to, f, v, k) for frm, to, f, v in _conv_values()
                            if is_heldout_value(f"{frm}-{to}-{v}") for k in range(6)],
        Family.CAPITAL: [_capital(c, cap, k) for c, cap, _, _ in CAPITALS if is_heldout_value(c) for k in range(6)],
        Family.FAQ: [_faq(e, 2, w, 4 + j) for e in range(len(_FAQ)) for j, w in enumerate(_FAQ_WRAP_HELD)],
    }


def training_stream(n: int, seed: int = 0) -> list[Question]:
    """`n` training questions as traffic: families drawn by MIX, questions with replacement (repeats happen)."""
    rng = random.Random(f"flywheel-train-{seed}")
    pools = all_training()
    fams = list(MIX)
    return [rng.choice(pools[f]) for f in rng.choices(fams, [MIX[f] for f in fams], k=n)]


def heldout(per_family: int, seed: int = 0, families: Sequence[Family] = FAMILIES) -> list[Question]:
    """`per_family` held-out questions of each family (distinct values where there are enough), in family order."""
    rng = random.Random(f"flywheel-heldout-{seed}")
    out: list[Question] = []
    pools = _all_heldout()
    for fam in families:
        by_value: dict[str, list[Question]] = {}
        for q in pools[fam]:
            by_value.setdefault(q.value, []).append(q)
        values = rng.sample(sorted(by_value), min(per_family, len(by_value)))
        picked = [rng.choice(by_value[v]) for v in values]
        while len(picked) < per_family:  # the FAQ has fewer entries than questions asked: other wordings
            rest = [q for q in pools[fam] if q not in picked]
            if not rest:
                break
            picked.append(rng.choice(rest))
        out += picked
    return out
