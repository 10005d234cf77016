"""Find an external tool a test needs (promtool, chromium, helm...), or say how to install it.

Missing tools skip the test on a developer's machine but fail it under CI (CI=true), where
scripts/test.sh has installed them: a green CI run must mean the checks really ran.
"""

from __future__ import annotations

import os
import shutil

import pytest

__all__ = ["require_tool"]


def require_tool(name: str, install: str) -> str:
    path = shutil.which(name)
    if path:
        return path
    message = f"{name} not found; install it with: {install}"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)
    pytest.skip(message)
