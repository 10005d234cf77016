"""Run the same tests N times in a row, serially, beside a CPU hog, and report every test that failed even once.

A flaky test turns a whole CI run red, and the races behind one show up when the machine is busy: the hog keeps
one core spinning for the whole run (on a 2-core machine, half of it), as a neighbour in CI would.

    .venv/bin/python scripts/repeat_tests.py --runs 3 tests/integration tests/chaos
    .venv/bin/python scripts/repeat_tests.py --runs 50 --report out.json \\
        "tests/integration/test_edge_node.py::test_what_outlives_the_drain_timeout_ends_with_an_explicit_error_and_no_traceback" \\
        tests/gateway/test_drain.py

Each run's outcome per test comes from pytest's JUnit XML; the report (JSON) lists, per test, how many runs it
ran, passed, failed and skipped, and the first failure's message. Exit status 1 if any test failed in any run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

ROOT = Path(__file__).resolve().parents[1]
app = typer.Typer(add_completion=False)

HOG = "while True:\n    pass\n"


@contextmanager
def cpu_hog(cores: int):
    """`cores` processes that spin until the block ends."""
    procs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(cores)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """test id -> (passed | failed | skipped, message) from one JUnit XML file."""
    out: dict[str, tuple[str, str]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        if failure is not None:
            out[name] = ("failed", (failure.get("message") or "")[:500])
        elif case.find("skipped") is not None:
            out[name] = ("skipped", "")
        else:
            out[name] = ("passed", "")
    return out


@app.command()
def main(
    tests: Annotated[list[str], typer.Argument(help="pytest paths or node ids.")],
    runs: Annotated[int, typer.Option(min=1, help="How many times in a row.")] = 3,
    hog: Annotated[int, typer.Option(min=0, help="CPU cores kept busy while the tests run.")] = 1,
    report: Annotated[Path | None, typer.Option(help="Write the JSON report here.")] = None,
    stop_on_failure: Annotated[bool, typer.Option(help="Stop after the first run with a failure.")] = False,
) -> None:
    """Run TESTS `--runs` times, serially, beside `--hog` busy cores; list every test that ever failed."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    first_failure: dict[str, str] = {}
    per_run: list[dict[str, int]] = []
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp, cpu_hog(hog):
        for i in range(1, runs + 1):
            junit = Path(tmp) / f"run-{i}.xml"
            t0 = time.monotonic()
            rc = subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o",
                                  "junit_family=xunit1", f"--junitxml={junit}", *tests], cwd=ROOT,
                                 stdin=subprocess.DEVNULL, env=os.environ | {"PYTHONUNBUFFERED": "1"})
            outcomes = _outcomes(junit) if junit.exists() else {}
            tally = Counter(state for state, _ in outcomes.values())
            for name, (state, message) in outcomes.items():
                counts[name][state] += 1
                if state == "failed":
                    first_failure.setdefault(name, f"run {i}: {message}")
            per_run.append({"run": i, "exit": rc, "seconds": round(time.monotonic() - t0, 1), **tally})
            typer.echo(f"== run {i}/{runs}: exit {rc}, {dict(tally)} in {per_run[-1]['seconds']} s", err=True)
            if stop_on_failure and (rc != 0 or tally["failed"]):
                break
    failed = {n: dict(c) | {"first_failure": first_failure[n]} for n, c in sorted(counts.items()) if c["failed"]}
    result = {"tests": tests, "runs": len(per_run), "hog_cores": hog, "cpus": os.cpu_count(),
              "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)),
              "per_run": per_run, "tests_seen": len(counts), "failed_at_least_once": failed,
              "command": " ".join(["scripts/repeat_tests.py", f"--runs {runs}", f"--hog {hog}", *tests])}
    if report is not None:
        report.write_text(json.dumps(result, indent=1) + "\n")
    typer.echo(f"{len(counts)} tests, {len(per_run)} runs beside {hog} busy core(s): "
               f"{len(failed)} failed at least once")
    for name, c in failed.items():
        typer.echo(f"  {name}: failed {c['failed']} of {c['failed'] + c.get('passed', 0)} ({c['first_failure']})")
    raise typer.Exit(1 if failed or any(r["exit"] not in (0, 5) for r in per_run) else 0)


if __name__ == "__main__":
    app()
