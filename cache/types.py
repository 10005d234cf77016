"""What the gateway stores in, and gets back from, the cache.

An answer is stored in a normalised form (text, finish reason, usage) so that one entry can be
replayed as a JSON response or as SSE chunks, whichever shape the new request asked for.

Tested in `tests/gateway/test_errors_render_schemas.py`.
"""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = ["CacheEntry", "CacheHit", "CacheStatus", "CachedAnswer"]

CacheStatus = Literal["hit-exact", "hit-semantic", "miss", "bypass"]


class CachedAnswer(msgspec.Struct, frozen=True):
    """One complete, successful answer."""

    kind: Literal["chat", "text"]
    text: str
    finish_reason: str
    model: str  # the public model name the answer was served under
    tier: str  # the tier that produced it originally (edge or cloud)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    created: int = 0  # unix seconds when stored


class CacheHit(msgspec.Struct, frozen=True):
    answer: CachedAnswer
    kind: Literal["hit-exact", "hit-semantic"]
    similarity: float = 1.0
    entry_id: str = ""
    namespace: str = ""
    overlap: float = 1.0  # content words shared with the stored question (`cache.guards.overlap`)
    # The error bound's axis when a verifier scored the pair (`cache.pairscore`); None: the bound used the cosine
    bound_score: float | None = None


class CacheEntry(msgspec.Struct, frozen=True):
    """One stored answer with what is needed to match it again (what the stores keep)."""

    id: str  # "<tenant tag>-<hash>": also the exact-match key
    tenant: str
    namespace: str
    text: str  # the normalised question text that was matched (for the guards)
    answer: CachedAnswer
    embedding: bytes = b""  # float32 little-endian, L2-normalised; empty: exact matching only
    max_tokens: int | None = None  # the budget the answer was produced under
    created: float = 0.0  # unix seconds
    expires_at: float = 0.0  # unix seconds
