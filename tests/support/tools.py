"""Find an external tool a test needs (promtool, chromium, helm...), or say how to install it.

Missing tools skip the test on a developer's machine but fail it under CI (CI=true), where
scripts/test.sh has installed them: a green CI run must mean the checks really ran.
"""

from __future__ import annotations

import shutil

from tests.support.require import skip_or_fail

__all__ = ["require_tool"]


def require_tool(name: str, install: str) -> str:
    path = shutil.which(name)
    if path:
        return path
    skip_or_fail(f"{name} not found; install it with: {install}", "tools")
    raise AssertionError("unreachable")  # skip_or_fail raises
