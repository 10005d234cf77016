"""`GET /v1/models` and `GET /v1/models/{id}`: what a client may put in `model`.

`auto` (the policy chooses), one model per tier, the embedding model while there is one, and the policy's
`model_aliases` (a client's own names, mapped to `auto` or a tier, so unmodified apps keep working). Retrieving a
name that only a glob alias matches (`claude-opus-4-8` under `claude-*`) answers its card too: that name works.

Tested in `tests/gateway/test_models.py` and `tests/integration/test_api_surfaces.py`.
"""

from __future__ import annotations

from collections.abc import Callable

from tiergate.core.errors import not_found
from tiergate.gateway.tiers import Tiers
from tiergate.policies.model import AUTO_MODEL

__all__ = ["ModelCards"]

Card = dict[str, object]


class ModelCards:
    """The model list of the active policy, built per call (the policy reloads)."""

    def __init__(self, tiers: Tiers, embedding: Callable[[int], Card | None], created: int) -> None:
        self._tiers, self._embedding, self._created = tiers, embedding, created

    def _card(self, model_id: str, **extra: object) -> Card:
        return {"id": model_id, "object": "model", "created": self._created, "owned_by": "tiergate", **extra}

    def all(self) -> list[Card]:
        cards = [self._card(AUTO_MODEL, description="Let the routing policy choose the tier.")]
        for tier in self._tiers.values():
            cfg = tier.config
            cards.append(self._card(cfg.model, tier=tier.name, kind=cfg.kind, stand_in=cfg.stand_in,
                                    backend_models=sorted({ep.model for ep in tier.pool.endpoints()}),
                                    description=tier.describe))
        if (embedding := self._embedding(self._created)) is not None:
            cards.append(embedding)
        for pattern, target in self._tiers.current.policy.model_aliases.items():
            cards.append(self._alias(pattern, target, pattern))
        return cards

    def get(self, model_id: str) -> Card:
        """The card of `model_id`, or a 404 `model_not_found` in OpenAI's shape."""
        for card in self.all():
            if card["id"] == model_id:
                return card
        if (alias := self._tiers.current.policy.alias_for(model_id)) is not None:  # a glob alias matches it
            return self._alias(model_id, alias[1], alias[0])
        raise not_found(f"The model `{model_id}` does not exist. See GET /v1/models.", code="model_not_found",
                        param="model")

    def _alias(self, model_id: str, target: str, pattern: str) -> Card:
        served = "`auto`" if target == AUTO_MODEL else f"tier `{target}`"
        return self._card(model_id, alias_for=target, alias_pattern=pattern,
                          description=f"A client's model name, served as {served} (policy model_aliases).")
