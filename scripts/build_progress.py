"""Turn pip's verbose llama.cpp build log into one progress bar (the full log goes to .tiergate/build.log)."""

import re
import sys
from pathlib import Path

log_path = Path(".tiergate/build.log")
log_path.parent.mkdir(exist_ok=True)
step = re.compile(rb"\[(\d+)/(\d+)\]")
try:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
except ImportError:  # pip's own vendored rich is not importable from the venv: plain lines instead
    Progress = None

with log_path.open("wb") as log:
    if Progress is None:
        last = None
        for line in sys.stdin.buffer:
            log.write(line)
            m = step.search(line)
            if m and m.group(1) != last:
                last = m.group(1)
                print(f"  compiling llama.cpp: step {int(m.group(1))}/{int(m.group(2))}", flush=True)
    else:
        with Progress(TextColumn("  compiling llama.cpp"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TimeElapsedColumn()) as progress:
            task = progress.add_task("build", total=None)
            for line in sys.stdin.buffer:
                log.write(line)
                m = step.search(line)
                if m:
                    progress.update(task, completed=int(m.group(1)), total=int(m.group(2)))
print(f"  build log: {log_path}")
