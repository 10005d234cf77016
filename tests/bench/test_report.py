"""bench/report: what every benchmark records about the machine, and the percentile it reports."""

from __future__ import annotations

import math

from bench.report import machine_facts, machine_line, pct, write_section


def test_machine_facts_are_read_from_the_machine() -> None:
    f = machine_facts()
    assert f["cpus"] and f["cpu_model"] and f["python"] and f["kernel"]
    assert len(f["load_average"]) == 3
    assert isinstance(f["cpu_flags"], list)
    line = machine_line(f, machine_facts())
    assert f["cpu_model"] in line and "at the end" in line


def test_pct() -> None:
    xs = list(range(1, 101))
    assert pct(xs, 50) == 50.5
    assert 98 < pct(xs, 99) <= 100
    assert math.isnan(pct([], 50))
    assert pct([7.0], 99) == 7.0
    assert pct([float("nan"), 3.0], 50) == 3.0


def test_write_section_replaces_only_its_own(tmp_path) -> None:
    docs = tmp_path / "b.md"
    docs.write_text("# Benchmarks\n\n## A\n\nold a\n\n## B\n\nold b\n")
    write_section("## A", "new a", docs)
    assert docs.read_text() == "# Benchmarks\n\n## A\n\nnew a\n\n## B\n\nold b\n"
    write_section("## C", "c", docs)
    assert docs.read_text().endswith("## C\n\nc\n")
