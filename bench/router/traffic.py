"""The default policy on mixed traffic: what `tiergate policy simulate` reports per source, for the shipped model.

The labelled prompts of every source become chat requests carrying their `source`; each is classified and
decided exactly as `tiergate policy simulate policies/default.yaml TRAFFIC.jsonl` does (the same Classifier,
engine and Simulation), so the per-source cloud shares here are that command's. `--write-traffic FILE`
writes the traffic file so the command can be run by hand.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.report import REPO
from tiergate.complexity.train import Labelled
from tiergate.policies.cli import (  # the command's own steps, not a copy of them
    _classifier,
    _classify_line,
    _load,
)
from tiergate.policies.loader import DEFAULT_POLICY
from tiergate.policies.simulate import Simulation

__all__ = ["simulate_default", "traffic_lines"]


def traffic_lines(data: Labelled) -> list[dict[str, Any]]:
    return [{"messages": [{"role": r, "content": t} for r, t in conv], "source": str(src)}
            for conv, src in zip(data.conversations, data.source.tolist(), strict=True)]


def simulate_default(data: Labelled, policy_file: Path = DEFAULT_POLICY, write: Path | None = None) -> dict[str, Any]:
    """Totals of `tiergate policy simulate` for the default policy on all labelled prompts."""
    lines = traffic_lines(data)
    if write is not None:
        write.write_text("".join(json.dumps(obj, ensure_ascii=False) + "\n" for obj in lines))
    loaded = _load(policy_file)
    clf = _classifier(loaded)
    sim = Simulation(loaded.policy)
    for obj in lines:
        _, f, d = _classify_line(clf, loaded.engine, obj)
        sim.row(f, d, obj["source"])
    totals = sim.totals()
    return {"policy": str(policy_file.relative_to(REPO)),
            "tokenizer_used": clf.counter_for(loaded.policy).spec_used, "totals": totals}
