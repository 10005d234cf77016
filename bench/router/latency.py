"""Classification latency as the gateway pays it, in a fresh process that imports only what the gateway imports.

The child loads the default policy (tokenizer `builtin:default`, so the token count and the features share one
WordPiece pass, as in a deployment without the demo model) through `policies.classify.Classifier`, warms up,
then times `Classifier.features` (token count + complexity) and the complexity score alone on each prompt, sent
as a one-message chat request, on one thread: wall time, and the thread's CPU time, which other jobs on a shared
machine do not stretch. It reports whether torch or scikit-learn got imported (neither may be) and its peak RSS.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.report import REPO

__all__ = ["measure"]

CHILD = """
import json, sys, time
from tiergate.core.types import Priority
from tiergate.core.wire import decode_chat
from tiergate.policies.classify import Classifier
from tiergate.policies.loader import load_policy

class Store:
    def __init__(self, policy):
        self.current = type("A", (), {"policy": policy})()

prompts = json.load(open(sys.argv[1]))
clf = Classifier(Store(load_policy(sys.argv[2])))
reqs = [decode_chat(json.dumps({"model": "auto", "messages": [{"role": "user", "content": p}]}).encode())
        for p in prompts]
model = clf.complexity_model(clf._store.current.policy)
for r in reqs[:100]:
    clf.features(r, "t", Priority.NORMAL, {})  # warm up
full, cx, cpu = [], [], []
for r in reqs:
    c0 = time.thread_time_ns()
    t0 = time.perf_counter_ns()
    clf.features(r, "t", Priority.NORMAL, {})
    t1 = time.perf_counter_ns()
    c1 = time.thread_time_ns()
    model.score([(m.role, m.text()) for m in r.messages])
    t2 = time.perf_counter_ns()
    full.append((t1 - t0) / 1e6)
    cx.append((t2 - t1) / 1e6)
    cpu.append((c1 - c0) / 1e6)
# VmHWM, not ru_maxrss: the latter keeps the forking parent's peak across exec
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps({"features_ms": full, "complexity_ms": cx, "features_cpu_ms": cpu, "peak_rss_mib": hwm / 1024,
                  "torch_imported": "torch" in sys.modules, "sklearn_imported": "sklearn" in sys.modules}))
"""


def measure(prompts: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "prompts.json"
        src.write_text(json.dumps(prompts))
        policy = Path(tmp) / "policy.yaml"
        policy.write_text((REPO / "policies" / "default.yaml").read_text()
                          .replace("tokenizer: builtin:demo", "tokenizer: builtin:default"))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
        out = subprocess.run([sys.executable, "-c", CHILD, str(src), str(policy)], check=True, env=env,
                             capture_output=True, text=True)
        return json.loads(out.stdout.strip().splitlines()[-1])
