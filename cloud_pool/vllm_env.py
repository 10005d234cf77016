"""Where the vLLM virtualenv's python is.

vLLM lives in its own virtualenv (it pins torch and a CPU build of itself) so the gateway's
environment stays free of torch. Everything that starts vLLM or builds its test model asks here.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ENV_VAR", "REPO_ROOT", "missing_reason", "vllm_python"]

REPO_ROOT = Path(__file__).resolve().parent.parent
ENV_VAR = "TIERGATE_VLLM_PYTHON"


def vllm_python(repo: Path = REPO_ROOT) -> Path | None:
    """`$TIERGATE_VLLM_PYTHON` if set, else `<repo>/.venv-vllm/bin/python`; None when it does not exist."""
    configured = os.environ.get(ENV_VAR)
    candidate = Path(configured) if configured else repo / ".venv-vllm" / "bin" / "python"
    return candidate if candidate.is_file() and os.access(candidate, os.X_OK) else None


def missing_reason(repo: Path = REPO_ROOT) -> str:
    """Why `vllm_python()` found nothing, and how to fix it (for skip messages and CLI errors)."""
    configured = os.environ.get(ENV_VAR)
    where = f"{ENV_VAR}={configured}" if configured else f"{repo / '.venv-vllm' / 'bin' / 'python'}"
    return f"no vLLM virtualenv python at {where}; run scripts/setup-vllm.sh (or set {ENV_VAR})"
