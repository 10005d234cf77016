"""Chaos figures for the docs: with TIERGATE_RECORD_CHAOS=1, each test records its latest run in
bench/results/chaos.json (a committed file, so an ordinary test run leaves the clone unchanged and only prints).

The file keeps, per scenario, the latest result (what docs/reliability.md quotes) and a short history.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

__all__ = ["RESULTS", "record"]

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "chaos.json"
_HISTORY = 20


def record(scenario: str, figures: dict, path: Path = RESULTS) -> dict:
    """Print `figures` and, when recording, store them as the latest result of `scenario` (with the time and
    machine); returns the entry."""
    entry = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **figures,
             "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"}
    print(f"\nchaos {scenario}: {json.dumps(figures)}")
    if os.environ.get("TIERGATE_RECORD_CHAOS") != "1":
        return entry
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    latest = data.setdefault("latest", {})
    history = data.setdefault("history", {})
    latest[scenario] = entry
    history[scenario] = ([entry] + history.get(scenario, []))[:_HISTORY]
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return entry
