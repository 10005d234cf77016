"""A closed-loop simulation of bounded-load prefix affinity: how often it spills, how even the load stays.

    .venv/bin/python -m bench.cloud.bound_sim

No servers: clients send requests one after another (service time exponential, a little slower when the
server is busier); each request's prompt is one of `prompts` evenly used prefixes, or with probability `hot`
a single hot one; every prefix ranks the servers at random (as rendezvous hashing does). Placement follows
`gateway.pools.selection`'s rule: the first server in the prefix's ranking whose in-flight count, with this
request, stays within ceil(bound x fair share); `smooth` instead bounds an exponentially smoothed load (and
keeps an instantaneous hard cap of 2x). Prints, per case, the share of requests that spilled and the
time-averaged max/mean load: the load side of the trade-off that bench.cloud measures on real vLLM.
"""

from __future__ import annotations

import heapq
import math
import random


def simulate(mode: str, servers: int, clients: int, *, prompts: int = 64, hot: float = 0.0, bound: float = 1.2,
             hard: float = 2.0, tau_s: float = 1.0, requests: int = 20_000, seed: int = 1) -> tuple[float, float]:
    """(share of requests spilled, time-averaged max/mean in-flight load)."""
    rng = random.Random(seed)
    ranks = [rng.sample(range(servers), servers) for _ in range(prompts + 1)]  # the last one is the hot prefix
    inflight = [0] * servers
    smooth = [0.0] * servers
    area = [0.0] * servers
    spilled = placed = 0
    last = prev = 0.0

    def place(now: float, key: int) -> int:
        nonlocal last, spilled, placed
        alpha = 1 - math.exp(-(now - last) / tau_s)
        last = now
        for i in range(servers):
            smooth[i] += alpha * (inflight[i] - smooth[i])
        total, total_smooth = sum(inflight), sum(smooth)
        placed += 1
        for rank, s in enumerate(ranks[key]):
            if mode == "instant":
                ok = inflight[s] + 1 <= math.ceil(bound * (total + 1) / servers - 1e-9)
            else:
                ok = (inflight[s] + 1 <= math.ceil(hard * (total + 1) / servers - 1e-9)
                      and smooth[s] <= bound * total_smooth / servers + 1e-9)
            if ok:
                spilled += rank > 0
                return s
        spilled += 1
        return min(range(servers), key=lambda i: inflight[i])

    events = [(rng.random() * 0.1, c, -1) for c in range(clients)]
    heapq.heapify(events)
    done = 0
    while done < requests:
        now, client, server = heapq.heappop(events)
        for i in range(servers):
            area[i] += inflight[i] * (now - prev)
        prev = now
        if server >= 0:
            inflight[server] -= 1
            done += 1
        key = prompts if rng.random() < hot else rng.randrange(prompts)
        s = place(now, key)
        inflight[s] += 1
        heapq.heappush(events, (now + rng.expovariate(1.0) * (1 + 0.1 * inflight[s]), client, s))
    return spilled / placed, max(area) / (sum(area) / servers)


def main() -> None:
    cases = {"instant, bound 1.2": ("instant", 1.2), "instant, bound 1.5": ("instant", 1.5),
             "smoothed 1 s, bound 1.2": ("smooth", 1.2)}
    print("| servers | clients | traffic | " + " | ".join(cases) + " |")
    print("|---|---|---|" + "---|" * len(cases))
    for servers, clients in ((2, 8), (4, 8), (4, 32)):
        for hot in (0.0, 0.8):
            cells = []
            for mode, bound in cases.values():
                spill, load = simulate(mode, servers, clients, hot=hot, bound=bound)
                cells.append(f"{spill:.0%} spilled, load {load:.2f}")
            traffic = "64 prefixes, even" if not hot else "80% one hot prefix"
            print(f"| {servers} | {clients} | {traffic} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
