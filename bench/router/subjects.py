"""The MMLU subject of every prompt in ../shared/data/routing/mmlu_dev.jsonl, for cross-validation by subject.

The prompts do not state their subject, but the file keeps MMLU's order: 40 of the 57 MMLU subjects, in
alphabetical order, each with its complete MMLU test split (the published split sizes: abstract_algebra 100,
anatomy 135, ...). Contiguous blocks of those sizes tile the file exactly (9,261 prompts); which 40 subjects
they are was settled by anchors in the text (every moral_scenarios prompt starts "For which of these two
scenarios", the three history subjects share "This question refers to the following information", and so on)
and checked by reading the prompts on both sides of every boundary. `subjects()` re-checks anchors on every
run and refuses a file that does not fit.
"""

from __future__ import annotations

from bisect import bisect_right

__all__ = ["BLOCKS", "SubjectsMismatch", "subjects"]

# (subject, index of its first prompt); each block runs to the next one's start.
BLOCKS: tuple[tuple[str, int], ...] = (
    ("abstract_algebra", 0), ("anatomy", 100), ("business_ethics", 235), ("college_chemistry", 335),
    ("college_mathematics", 435), ("college_medicine", 535), ("college_physics", 708), ("computer_security", 810),
    ("conceptual_physics", 910), ("econometrics", 1145), ("formal_logic", 1259), ("global_facts", 1385),
    ("high_school_chemistry", 1485), ("high_school_european_history", 1688), ("high_school_geography", 1853),
    ("high_school_government_and_politics", 2051), ("high_school_microeconomics", 2244),
    ("high_school_physics", 2482), ("high_school_psychology", 2633), ("high_school_statistics", 3178),
    ("high_school_us_history", 3394), ("high_school_world_history", 3598), ("human_aging", 3835),
    ("international_law", 4058), ("jurisprudence", 4179), ("logical_fallacies", 4287), ("management", 4450),
    ("medical_genetics", 4553), ("miscellaneous", 4653), ("moral_disputes", 5436), ("moral_scenarios", 5782),
    ("philosophy", 6677), ("prehistory", 6988), ("professional_accounting", 7312),
    ("professional_medicine", 7594), ("professional_psychology", 7866), ("security_studies", 8478),
    ("sociology", 8723), ("virology", 8924), ("world_religions", 9090),
)
TOTAL = 9261

# Text every prompt of a block starts with (whole blocks), checked on every run.
_WHOLE_BLOCK_PREFIX = {
    "moral_scenarios": "For which of these two scenarios",
    "high_school_european_history": "This question refers to the following information.",
    "high_school_us_history": "This question refers to the following information.",
    "high_school_world_history": "This question refers to the following information.",
}
# A word from the first prompt of some blocks (a spot check of the boundaries).
_FIRST_PROMPT_HAS = {
    "abstract_algebra": "field extension",
    "anatomy": "facial nerve",
    "college_physics": "photon detector",
    "econometrics": "Which one of the following",
    "high_school_chemistry": "London dispersion",
    "international_law": "jurisdiction",
    "medical_genetics": "Robertsonian",
    "philosophy": "Aesthetics",
    "professional_medicine": "67-year-old woman",
    "virology": "polyomaviruses",
}


class SubjectsMismatch(ValueError):
    """The data file is not the one the subject blocks were derived for."""


def subjects(prompts: list[str]) -> list[str]:
    """The subject of each prompt, in order; raises SubjectsMismatch when the anchors do not hold."""
    if len(prompts) != TOTAL:
        raise SubjectsMismatch(f"expected {TOTAL} prompts in MMLU order, got {len(prompts)}")
    starts = [s for _, s in BLOCKS]
    names = [n for n, _ in BLOCKS]
    out = [names[bisect_right(starts, i) - 1] for i in range(len(prompts))]
    ends = starts[1:] + [TOTAL]
    for (name, start), end in zip(BLOCKS, ends, strict=True):
        prefix = _WHOLE_BLOCK_PREFIX.get(name)
        if prefix is not None and not all(p.startswith(prefix) for p in prompts[start:end]):
            raise SubjectsMismatch(f"block {name} [{start}, {end}) is not all {prefix!r} prompts")
        word = _FIRST_PROMPT_HAS.get(name)
        if word is not None and word not in prompts[start]:
            raise SubjectsMismatch(f"prompt {start} does not look like the first {name} question")
    return out
