"""Versions of the third-party baselines the benchmarks install, pinned in one place.

bench/router (LiteLLM's rule-based complexity router) and bench/overhead (LiteLLM's proxy) share one virtualenv,
`.venv-litellm`, created with `LITELLM_SPEC`; each benchmark prints the version it actually ran.
"""

from __future__ import annotations

__all__ = ["LITELLM_SPEC", "LITELLM_VERSION"]

LITELLM_VERSION = "1.108.7"
LITELLM_SPEC = f"litellm[proxy]=={LITELLM_VERSION}"
