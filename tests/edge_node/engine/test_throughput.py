"""`edge_node.engine.throughput.TokenRate`: tokens per second over a sliding window, bounded in memory."""

from __future__ import annotations

from tiergate.edge_node.engine import throughput
from tiergate.edge_node.engine.throughput import TokenRate


def test_the_rate_counts_what_the_window_holds_and_forgets_the_rest(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(throughput.time, "monotonic", lambda: now[0])
    rate = TokenRate(window_s=2.0)
    rate.add(10)
    now[0] = 101.0
    rate.add(6)
    assert rate.per_second() == 8.0  # 16 tokens in a 2 s window
    now[0] = 102.5  # the first sample is now older than the window
    assert rate.per_second() == 3.0 and len(rate) == 1


def test_samples_stay_bounded_without_readers(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(throughput.time, "monotonic", lambda: now[0])
    rate = TokenRate(window_s=1.0)
    for i in range(1000):
        now[0] = i * 0.1
        rate.add(1)
    assert len(rate) <= 11
