"""Writing a benchmark's results into its own section of docs/benchmarks.md, leaving the others untouched."""

from __future__ import annotations

from pathlib import Path

__all__ = ["DOCS", "write_section"]

DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


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
