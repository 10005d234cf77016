"""Labelled data for complexity tests: synthetic traffic of known structure, and where the shared data lives."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def routing_data() -> Path:
    """../shared/data/routing beside the checkout; from a git worktree, beside the main checkout."""
    here = ROOT.parent / "shared" / "data" / "routing"
    if here.is_dir():
        return here
    common = subprocess.run(["git", "rev-parse", "--git-common-dir"], cwd=ROOT, capture_output=True, text=True)
    if common.returncode != 0:
        return here
    return Path(ROOT, common.stdout.strip()).resolve().parent.parent / "shared" / "data" / "routing"


ROUTING = routing_data()
TOPICS = ["bridges", "gardens", "rivers", "museums", "trains", "coffee", "music", "winter", "birds", "tea"]
FILLER = ["please", "today", "really", "my friend said", "quickly", "honestly", "for my class", "again", "thanks",
          "in short", "if you can", "by tomorrow"]


def synthetic(source: str, n: int, seed: int = 0) -> list[dict]:
    """Rows of one kind of traffic in which only the hard half gains from the strong model (fractional labels).

    "chat": hard prompts ask for code; "writing": hard ones ask for a long, constrained text;
    "lookup": hard ones ask to explain why, step by step. Easy prompts are short everyday questions."""
    rnd = random.Random(f"{source}-{seed}")
    rows = []
    for i in range(n):
        topic = rnd.choice(TOPICS)
        hard = i % 2 == 0
        if source == "chat":
            prompt = (f"Write a Python function that parses a JSON list of {topic} and returns the longest; "
                      "do not use any library and include tests." if hard else f"Do you like {topic}?")
        elif source == "writing":
            prompt = (f"Write a detailed essay of at least {500 + i} words about {topic}, in five paragraphs, "
                      "each with exactly three sentences." if hard else f"Name a famous place with {topic}.")
        else:
            prompt = (f"Explain step by step why {topic} behave as they do if it is cold, and what that implies."
                      if hard else f"What is {topic}?")
        prompt += " " + " ".join(rnd.sample(FILLER, rnd.randint(0, 5)))  # variety: no two prompts tie
        weak = round(rnd.uniform(0.1, 0.4), 2) if hard else round(rnd.uniform(0.7, 0.9), 2)
        strong = round(rnd.uniform(0.8, 1.0), 2) if hard else round(rnd.uniform(0.7, 0.9), 2)
        rows.append({"prompt": prompt, "weak_correct": weak, "strong_correct": strong, "source": source})
    return rows


def multiple_choice(n: int, seed: int = 0) -> list[dict]:
    """Lettered-option questions: the ones with verdict options ("True, False") gain, plain recall does not."""
    rnd = random.Random(seed)
    rows = []
    for i in range(n):
        hard = i % 2 == 0
        topic = rnd.choice(TOPICS)
        if hard:
            prompt = (f"Statement 1 | Every {topic} is blue. Statement 2 | Some {topic} are {i}.\n"
                      "A. True, True\nB. False, False\nC. True, False\nD. False, True\nAnswer:")
        else:
            prompt = f"Which of these is a {topic}?\nA. a {topic}\nB. a stone\nC. a cloud\nD. a number\nAnswer:"
        rows.append({"prompt": prompt, "weak_correct": rnd.random() < (0.3 if hard else 0.9),
                     "strong_correct": rnd.random() < 0.9, "source": "quiz"})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
