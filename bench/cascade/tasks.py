"""The labelled questions bench/cascade asks the edge model: graded difficulty, exactly checkable gold answers.

A confidence signal can only be measured where the edge model is sometimes right and sometimes wrong, so
the tasks climb in difficulty for SmolLM2-135M: capitals of countries (it knows most), the reverse question
(which country has this capital), one-digit sums, one-digit products, two-digit sums, two-digit by one-digit
products. MMLU is the control where it knows nothing (it answers "A" to everything): a signal that "works"
there would be measuring something else.

- Arithmetic is generated from a seed (our own data).
- Capitals are bench/cascade/capitals.py (our own data).
- MMLU questions with gold letters: ../shared/data/routing/mmlu_gold_dev.jsonl, from MMLU-Redux (CC BY 4.0,
  LICENSE-mmlu-redux beside the file); sampled with the seed.

Each task has two phrasings, used alternately, both asking for a short answer: real traffic is not one
template, and a signal that only works for one phrasing would be fragile.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.cascade.capitals import CAPITALS
from bench.cascade.check import EntityIndex, entity_right, letter_right, number_right
from bench.report import REPO

__all__ = ["DEFAULT_N", "MMLU_FILE", "TASKS", "Item", "make_items"]

# ../shared beside the checkout; a git worktree one level deeper (wt/NAME) finds the same folder one level up.
MMLU_FILE = next((p for p in (REPO.parent / "shared", REPO.parent.parent / "shared") if p.is_dir()),
                 REPO.parent / "shared") / "data" / "routing" / "mmlu_gold_dev.jsonl"

# Task name -> default number of questions (capped by how many distinct ones exist).
DEFAULT_N: dict[str, int] = {
    "capital": 144, "country": 144, "add_1d": 100, "mul_1d": 100, "add_2d": 100, "mul_2x1d": 100, "mmlu": 150,
}
TASKS = tuple(DEFAULT_N)


@dataclass(frozen=True)
class Item:
    """One question: its prompt, its gold answer (as text, for the record) and the rule that checks it."""

    id: str
    task: str
    prompt: str
    gold: str
    check: Callable[[str], bool] = field(repr=False, compare=False)


_ADD = ("What is {a} + {b}? Answer with one number.", "What is {a} plus {b}? Reply with only the number.")
_MUL = ("What is {a} * {b}? Answer with one number.", "What is {a} times {b}? Reply with only the number.")
_CAPITAL = ("What is the capital of {x}? Answer with one word.", "Name the capital city of {x}. Reply with only the name.")
_COUNTRY = ("Which country has {x} as its capital? Answer with one word.",
            "{x} is the capital of which country? Reply with only the name.")
_MMLU_SUFFIX = "Answer with one letter."

_CAPITAL_INDEX = EntityIndex({cap: aliases for _, cap, aliases, _ in CAPITALS})
_COUNTRY_INDEX = EntityIndex({country: aliases for country, _, _, aliases in CAPITALS})


def _arithmetic(task: str, n: int, rng: random.Random) -> list[Item]:
    lo_a, hi_a, lo_b, hi_b, op = {
        "add_1d": (0, 9, 0, 9, "+"), "mul_1d": (0, 9, 0, 9, "*"),
        "add_2d": (10, 99, 10, 99, "+"), "mul_2x1d": (10, 99, 2, 9, "*"),
    }[task]
    pairs = [(a, b) for a in range(lo_a, hi_a + 1) for b in range(lo_b, hi_b + 1)]
    templates = _ADD if op == "+" else _MUL
    out = []
    for i, (a, b) in enumerate(rng.sample(pairs, min(n, len(pairs)))):
        gold = a + b if op == "+" else a * b
        out.append(Item(f"{task}-{a}-{b}", task, templates[i % 2].format(a=a, b=b), str(gold),
                        lambda ans, g=gold, ops=(a, b): number_right(ans, g, ops)))
    return out


def _capitals(task: str, n: int, rng: random.Random) -> list[Item]:
    rows = rng.sample(CAPITALS, min(n, len(CAPITALS)))
    out = []
    for i, (country, capital, _, _) in enumerate(rows):
        if task == "capital":
            prompt, gold, index = _CAPITAL[i % 2].format(x=country), capital, _CAPITAL_INDEX
        else:
            prompt, gold, index = _COUNTRY[i % 2].format(x=capital), country, _COUNTRY_INDEX
        out.append(Item(f"{task}-{country}", task, prompt, gold,
                        lambda ans, g=gold, ix=index: entity_right(ans, g, ix)))
    return out


def _mmlu(n: int, rng: random.Random, path: Path = MMLU_FILE) -> list[Item]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    out = []
    for k, row in sorted((k, rows[k]) for k in rng.sample(range(len(rows)), min(n, len(rows)))):
        text = row["prompt"].rstrip()
        text = text.removesuffix("Answer:").rstrip()
        out.append(Item(f"mmlu-{k}", "mmlu", f"{text}\n{_MMLU_SUFFIX}", row["answer"],
                        lambda ans, g=row["answer"]: letter_right(ans, g)))
    return out


def make_items(counts: dict[str, int], seed: int = 0, mmlu_file: Path = MMLU_FILE) -> list[Item]:
    """The questions of every task with a non-zero count, in task order; the same seed gives the same list."""
    items: list[Item] = []
    for task, n in counts.items():
        if n <= 0:
            continue
        rng = random.Random(f"{seed}-{task}")
        if task in ("capital", "country"):
            items += _capitals(task, n, rng)
        elif task == "mmlu":
            items += _mmlu(n, rng, mmlu_file)
        elif task in TASKS:
            items += _arithmetic(task, n, rng)
        else:
            raise ValueError(f"unknown task {task!r}; known: {', '.join(TASKS)}")
    return items
