"""bench/cloud's request sequences: many tenants, each with its own system prompt, and a short user turn.

A system prompt is ~200 tokens (~6.5 KV blocks of 32); a server's KV cache holds `--kv-blocks` blocks. The
regimes span the cases routing can and cannot help: prompts that fit in every server's cache, prompts that fit
only when split between the servers, more than all caches hold, and the long tail (docs/cloud.md: many apps,
each its own system prompt, few reuses): a few popular apps and many that come back once or twice, where the
cold misses nobody can avoid bound every router's hit rate.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tiergate.cloud_pool.tiny_model import words

__all__ = ["REGIMES", "Regime", "requests", "text"]

_VOCAB: list[str] = []


def _words() -> list[str]:
    if not _VOCAB:
        _VOCAB.extend(words(600))
    return _VOCAB


def text(rng: random.Random, n: int) -> str:
    vocab = _words()
    return " ".join(rng.choice(vocab) for _ in range(n))


@dataclass(frozen=True)
class Regime:
    label: str
    prompts: int  # distinct system prompts (tenants' apps)
    zipf: float  # popularity ~ 1 / rank ** zipf


REGIMES = {
    "zipf8": Regime("8 apps, Zipf 0.8", 8, 0.8),
    "even32": Regime("32 apps, even", 32, 0.0),
    "even64": Regime("64 apps, even", 64, 0.0),
    "even96": Regime("96 apps, even", 96, 0.0),
    "longtail": Regime("long tail: 200 apps, Zipf 1.1", 200, 1.1),
}


def requests(n: int, regime: Regime, seed: int = 11) -> list[tuple[str, str]]:
    """`n` (system, user) pairs, the same for every router (same seed)."""
    rng = random.Random(seed)
    systems = [f"Assistant profile {i} of tenant {i % 17}. " + text(rng, 120) for i in range(regime.prompts)]
    weights = [1 / (rank + 1) ** regime.zipf for rank in range(regime.prompts)]
    return [(rng.choices(systems, weights)[0], text(rng, rng.randint(8, 15))) for _ in range(n)]
