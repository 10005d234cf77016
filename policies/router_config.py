"""The policy's `router` section: the learned pre-generation router (docs/policy.md, "Learned router").

A rule's `edge_success` condition reads the router's P(the edge's answer stands); this section says where its
model is (`tiergate classifier train --from-outcomes` writes it; the gateway reloads it when it changes), which edge
tier it predicts for, which cascade judges the edge answers it learns from, and how often a request it sends to the
cloud is still tried on the edge, unseen, so that it keeps learning (`explore`).

Tested in `tests/policies/test_router_config.py`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from pydantic import Field

from tiergate.complexity.edge_router import RouterArtifact, RouterModel, features_of
from tiergate.core.types import Features
from tiergate.policies.base import StrictModel

__all__ = ["RouterConfig", "edge_tier_of", "offline_router", "router_issues"]


class RouterConfig(StrictModel):
    """Learned routing: outcome records, the model the `edge_success` condition reads, exploration."""

    model: str = Field(min_length=1, description="the router artifact (.json) `tiergate classifier train "
                                                 "--from-outcomes` writes; missing: cold start, no rule's "
                                                 "edge_success holds")
    edge_tier: str | None = Field(None, description="the edge tier predicted for; default: the policy's only edge tier")
    judge_rule: str | None = Field(None, description="the cascade rule whose thresholds judge explored edge answers; "
                                                     "default: the first cascade rule on edge_tier")
    explore: float = Field(0.05, ge=0.0, le=1.0, description="share of requests an edge_success rule sends elsewhere "
                                                              "that the edge also answers, unseen, for labels")
    explore_concurrency: int = Field(4, ge=1, le=256, description="explorations running at once per gateway; more "
                                                                  "are skipped (counted)")
    verify: float = Field(0.0, ge=0.0, le=1.0, description="share of the answers a cascade keeps that are also "
                                                            "asked of its target, detached, to judge the kept "
                                                            "answer against (agreement labels; the operator's cost)")
    record: bool = Field(True, description="record every judged edge answer as an outcome (the training data)")
    max_records: int = Field(100_000, ge=100, le=10_000_000, description="the oldest outcomes go beyond this")
    ttl_s: int = Field(14 * 86400, ge=3600, description="outcomes older than this are dropped")


def edge_tier_of(cfg: RouterConfig, tiers: dict[str, str]) -> str | None:
    """The edge tier the router predicts for (`tiers`: name -> kind), or None when it cannot tell."""
    if cfg.edge_tier is not None:
        return cfg.edge_tier
    edges = [n for n, kind in tiers.items() if kind == "edge"]
    return edges[0] if len(edges) == 1 else None


def router_issues(cfg: RouterConfig | None, tiers: dict[str, str], cascade_rules: dict[str, str],
                  uses_condition: list[int], artifact: str | None) -> list[tuple[tuple[str | int, ...], str, bool]]:
    """(path, message, is_error) for the `router` section and the rules' `edge_success` conditions.

    `tiers`: name -> kind; `cascade_rules`: cascade rule name -> its first tier, in file order; `uses_condition`:
    indexes of rules with `edge_success`; `artifact`: the model's resolved path, when files are checked."""
    out: list[tuple[tuple[str | int, ...], str, bool]] = []
    if cfg is None:
        out += [(("rules", i, "when", "edge_success"), "edge_success needs a `router:` section (its model)", True)
                for i in uses_condition]
        return out
    edge = edge_tier_of(cfg, tiers)
    if cfg.edge_tier is not None and tiers.get(cfg.edge_tier) != "edge":
        out.append((("router", "edge_tier"), f"{cfg.edge_tier!r} is not an edge tier", True))
    elif edge is None:
        out.append((("router",), "the policy has several edge tiers (or none): name one as `edge_tier`", True))
    if cfg.judge_rule is not None:
        if cfg.judge_rule not in cascade_rules:
            out.append((("router", "judge_rule"), f"{cfg.judge_rule!r} is not a cascade rule; cascade rules: "
                                                   f"{', '.join(cascade_rules) or 'none'}", True))
    elif edge is not None and edge not in cascade_rules.values() and cfg.explore > 0:
        out.append((("router", "explore"), f"exploration judges edge answers by a cascade rule on {edge!r}, and "
                                           "there is none: add one or set explore: 0", True))
    if artifact is not None:
        try:
            RouterArtifact.load(Path(artifact))
        except FileNotFoundError:
            out.append((("router", "model"), f"{artifact[:200]!r} does not exist yet: cold start (no edge_success "
                                             "condition holds) until `tiergate classifier train --from-outcomes` "
                                             "writes it", False))
        except ValueError as exc:
            out.append((("router", "model"), str(exc), True))
    return out


def offline_router(cfg: RouterConfig | None, model_path: Path, tiers: dict[str, tuple[str, str]],
                   edge_version: str | None) -> tuple[str | None, Callable[[Features], Features] | None]:
    """What the gateway's router would add to Features, away from a gateway (`tiergate policy simulate`): the edge
    version used (`edge_version`, else the edge tier's served model) and the function, None on a cold start.
    `tiers`: name -> (kind, served model). ValueError when the model file does not load."""
    if cfg is None:
        return None, None
    edge = edge_tier_of(cfg, {n: kind for n, (kind, _) in tiers.items()})
    version = edge_version or (tiers[edge][1] if edge in tiers else None)
    try:
        artifact = RouterArtifact.load(model_path)
    except FileNotFoundError:
        return version, None
    model: RouterModel | None = artifact.get(version) if version is not None else None
    if model is None:
        return version, None
    return version, lambda f: dataclasses.replace(f, edge_success=model.predict(features_of(f)))
