"""What a test that registers an edge node by hand sends along with its heartbeats: the claim `edge-node serve` makes
up for itself (`core.edge_identity.CLAIM_HEADER`), which binds the node id to the test's registration."""

from __future__ import annotations

from tiergate.core.edge_identity import CLAIM_HEADER

__all__ = ["CLAIM", "claim"]


def claim(name: str = "tests") -> dict[str, str]:
    """The claim header of one registering party (each name its own claim)."""
    return {CLAIM_HEADER: f"claim-of-{name}".ljust(16, "-")}


CLAIM = claim()
