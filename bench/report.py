"""What every benchmark reports besides its own numbers: the machine it ran on, read by the run itself, and its
section of docs/benchmarks.md.

The machine is shared and its idle settings change latencies, so a result is only worth as much as the record of
the conditions it was measured under: CPU model and flags, cores, load average and CPU pressure before and after,
how idle vCPUs sleep, kernel and Python versions.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path

__all__ = ["DOCS", "REPO", "RESULTS", "cpu_pressure", "machine_facts", "machine_line", "pct", "publish", "write_section"]

REPO = Path(__file__).resolve().parent.parent  # the source tree: benchmarks read policies and models from it
DOCS = REPO / "docs" / "benchmarks.md"
RESULTS = REPO / "bench" / "results"

# The flags that decide which ggml / torch kernels run, out of the dozens /proc/cpuinfo lists.
_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_tile")


def publish(report: dict, out: Path, render: Callable[[dict, Path], str], section: str | None) -> str:
    """Write a run's raw results to `out`, print the report rendered from them and, when `section` is given, put
    it in docs/benchmarks.md under that heading; returns the text. The table always comes from the file's data."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    text = render(report, out)
    print(text)
    if section is not None:
        write_section(section, text)
    return text


def write_section(heading: str, text: str, docs: Path = DOCS) -> None:
    """Replace the `## heading` section (up to the next `## `) with `text`, or append it; `text` may omit the heading."""
    section = (text if text.lstrip().startswith(heading) else f"{heading}\n\n{text.strip()}").rstrip() + "\n"
    doc = docs.read_text() if docs.exists() else "# Benchmarks\n"
    if heading in doc:
        start = doc.index(heading)
        nxt = doc.find("\n## ", start + len(heading))
        doc = doc[:start] + section + (doc[nxt:] if nxt != -1 else "")
    else:
        doc = doc.rstrip() + "\n\n" + section
    docs.write_text(doc)


def _read(path: str) -> str | None:
    with contextlib.suppress(OSError):
        return Path(path).read_text().strip()
    return None


def cpu_pressure() -> float | None:
    """Linux PSI: % of the last 10 s in which runnable tasks waited for a CPU (other work on the machine)."""
    text = _read("/proc/pressure/cpu")
    with contextlib.suppress(AttributeError, IndexError, ValueError):
        return float(text.splitlines()[0].split("avg10=")[1].split()[0])
    return None


def machine_facts() -> dict:
    """A snapshot of the conditions a run starts or ends under; call it at both ends."""
    info = _read("/proc/cpuinfo") or ""
    model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), None)
    flags = next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), [])
    mem = _read("/proc/meminfo") or ""
    avail = next((int(ln.split()[1]) for ln in mem.splitlines() if ln.startswith("MemAvailable:")), 0)
    total = next((int(ln.split()[1]) for ln in mem.splitlines() if ln.startswith("MemTotal:")), 0)
    return {
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "cpu_model": model or platform.processor() or platform.machine(),
        "cpu_flags": [f for f in _FLAGS if f in flags],
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "cpu_pressure_avg10": cpu_pressure(),
        "mem_total_gib": round(total / 2**20, 1),
        "mem_available_gib": round(avail / 2**20, 1),
        "cpuidle_governor": _read("/sys/devices/system/cpu/cpuidle/current_governor_ro")
        or _read("/sys/devices/system/cpu/cpuidle/current_governor"),
        "guest_halt_poll_ns": _read("/sys/module/haltpoll/parameters/guest_halt_poll_ns"),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def machine_line(before: dict, after: dict | None = None) -> str:
    """One sentence for the docs: what the machine was and how busy, from the run's own snapshots."""
    flags = "/".join(before["cpu_flags"]) or "none of the SIMD flags checked"
    idle = (f"idle vCPUs: governor {before['cpuidle_governor']}, guest_halt_poll_ns {before['guest_halt_poll_ns']}"
            if before.get("cpuidle_governor") or before.get("guest_halt_poll_ns") is not None else "")
    load = f"load average {before['load_average'][0]:.1f} at start"
    if after:
        load += f", {after['load_average'][0]:.1f} at the end"
    return (f"Machine (read by the run): {before['cpu_model']}, {before['cpus']} cores ({flags}), "
            f"{before['mem_total_gib']:.0f} GiB, {load}; {idle}; Linux {before['kernel']}, Python {before['python']}.")


def pct(values: Iterable[float], p: float) -> float:
    """The p-th percentile (0-100) by linear interpolation; nan for no values."""
    xs = sorted(v for v in values if not math.isnan(v))
    if not xs:
        return float("nan")
    if len(xs) == 1:
        return xs[0]
    return statistics.quantiles(xs, n=1000, method="inclusive")[max(0, min(998, round(p * 10) - 1))]
