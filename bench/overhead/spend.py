"""The spend and budget bookkeeping alone: what it adds to each request's CPU, without the rest of the gateway.

    .venv/bin/python -m bench.overhead.spend [--requests 20000] [--passes 5]

Drives `gateway.budgets.Budgets` on the in-process ledger as a request's settlement does: `record` settles a
priced request of a tenant without a budget (the day's spend record only); `budget` reserves a worst case from a
tenant's budget and settles it (what a budgeted request adds). Reports the median of the passes, with min..max,
in microseconds of CPU per request. The whole-gateway comparison is `bench.overhead.inprocess --policy-extra`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from prometheus_client import CollectorRegistry

from tiergate.core.types import Decision
from tiergate.gateway.auth import hash_key
from tiergate.gateway.budgets import Budgets, worst_case
from tiergate.gateway.ledger import LocalLedger
from tiergate.gateway.metrics import GatewayMetrics
from tiergate.policies.loader import parse_policy

POLICY = parse_policy("""\
version: 1
tiers:
  edge: {kind: edge, model: tiergate-edge, endpoints: ["http://127.0.0.1:1"]}
costs: {currency: USD, reference_tier: edge, prices: {edge: {prompt_per_1k: 0.00002, completion_per_1k: 0.00005}}}
budgets:
  tenants:
    bench: {period: month, hard: 1000000, soft: 900000}
rules:
  - {name: default, tier: edge}
""")
KEY = hash_key("bench-key")
FIELDS = {"cost|edge|default|answer": 1e-6, "ref|edge|default": 1e-6, "requests": 1, "prompt": 20, "completion": 8,
          "cost": 1e-6}


async def _pass(requests: int) -> tuple[float, float]:
    budgets = Budgets(GatewayMetrics(CollectorRegistry()), LocalLedger())
    decision = Decision("default", "edge")
    c0 = time.process_time()
    for _ in range(requests):
        await budgets.settle(None, POLICY, "other", KEY, 1e-6, FIELDS)
    record = (time.process_time() - c0) / requests
    c0 = time.process_time()
    for _ in range(requests):
        hold, _ = await budgets.reserve(POLICY, "bench", KEY, worst_case(POLICY, decision, 20, 8))
        await budgets.settle(hold, POLICY, "bench", KEY, 1e-6, FIELDS)
    return record * 1e6, (time.process_time() - c0) / requests * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--passes", type=int, default=5)
    args = ap.parse_args()
    passes = [asyncio.run(_pass(args.requests)) for _ in range(args.passes)]
    for i, name in enumerate(("record", "budget")):
        values = [p[i] for p in passes]
        print(f"{name}: {statistics.median(values):.1f} us CPU per request "
              f"({min(values):.1f}..{max(values):.1f}, {args.passes} passes of {args.requests})")


if __name__ == "__main__":
    main()
