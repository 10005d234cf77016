"""llama.cpp's own server tests (`tools/server/tests/unit` of the llama.cpp in llama-cpp-python's sdist) against
`edge-node serve` on the real SmolLM2, and the Responses and Anthropic Messages ones also against the gateway.

Each module runs in its own pytest process from the staged copy tests/llama_server/adaptations.py makes: their
tests as released but for the expected texts tuned to SmolLM2, with stand-ins for their `utils.py` (which server is
started) and `conftest.py` (what is skipped, and why). None may fail; every skip must carry one of the listed
reasons (tests/llama_server/ADAPTATIONS.md). The sdist is fetched with pip (cached under the tiergate home) by
training/converters.py: without it this test fails, it never skips.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.llama_server.adaptations import EDGE_SURFACES, GATEWAY_MODULES, MODULES, SKIPS, SLOW, stage
from tiergate.training.converters import llama_server_tests

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
CASES = [("edge", m) for m in MODULES] + [("gateway", m) for m in GATEWAY_MODULES]


@pytest.fixture(scope="module")
def source() -> Path:
    return llama_server_tests()  # pip download on first use; a failure here fails the test


@pytest.mark.parametrize("target, module", CASES, ids=[f"{t}-{m.removesuffix('.py')}" for t, m in CASES])
def test_llama_server_tests_pass_or_are_skipped_for_a_listed_reason(source, target, module, tmp_path):
    staged = stage(source, tmp_path / "suite")
    junit = tmp_path / "junit.xml"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "TIERGATE_LLAMA_UTILS": str(source / "utils.py"), "TIERGATE_LLAMA_TARGET": target,
           "TIERGATE_LLAMA_WORKDIR": str(tmp_path / "servers")}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", "pytest.ini",
                           "--rootdir", ".", "-o", "timeout=300", "-rfEs", f"--junitxml={junit}", f"unit/{module}"],
                          cwd=staged, env=env, capture_output=True, text=True, check=False, timeout=1700)
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None, done.stdout[-3000:]
    failed = [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None
              or c.find("error") is not None]
    assert done.returncode == 0 and not failed, f"{failed}\n{done.stdout[-12000:]}\n{done.stderr[-3000:]}"
    reasons = {SLOW} | {reason for _, _, reason in SKIPS}
    skipped = {c.get("name"): (c.find("skipped").get("message") or "") for c in suite.iter("testcase")
               if c.find("skipped") is not None}
    unlisted = {name: why for name, why in skipped.items() if not any(r in why for r in reasons)}
    assert not unlisted, unlisted
    ran = int(suite.get("tests", 0)) - len(skipped)
    assert ran > 0 or all(EDGE_SURFACES in why for why in skipped.values()), done.stdout[-3000:]  # served elsewhere
