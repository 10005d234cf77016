"""What a test needs and cannot have: a skip on a developer's machine, a failure under CI.

CI (`CI=true`, set by the CI runner) and `TIERGATE_REQUIRE_<WHAT>=1` (set by scripts/test.sh for vLLM, or by a
developer) turn the skip into a failure: there, scripts/test.sh has installed everything, so a missing piece (no
llama-cpp-python, no vLLM virtualenv, a port the demo needs held by another process) means the run did not check
what it claims, and a green run must mean the checks really ran.
"""

from __future__ import annotations

import os

import pytest

__all__ = ["required", "skip_or_fail"]


def required(what: str) -> bool:
    """Whether a missing `what` fails the test: under CI, or with TIERGATE_REQUIRE_<WHAT>=1."""
    return (os.environ.get("CI", "").lower() in ("1", "true", "yes")
            or os.environ.get(f"TIERGATE_REQUIRE_{what.upper()}") == "1")


def skip_or_fail(message: str, what: str) -> None:
    """Skip the test, or fail it when `what` is required (see `required`)."""
    if required(what):
        pytest.fail(f"{message} (required here: CI or TIERGATE_REQUIRE_{what.upper()}=1)", pytrace=False)
    pytest.skip(message)
