"""Where tiergate keeps what it builds or installs locally: `$TIERGATE_HOME`, else `.tiergate/` in the source tree.

Models (the demo's generated GGUFs, assembled packaged models, converted vLLM checkpoints), the exported
embedder and build logs live there; nothing in it is committed, and deleting it only costs a `tiergate prepare`.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["tiergate_home"]

_SOURCE_TREE = Path(__file__).resolve().parent.parent


def tiergate_home() -> Path:
    env = os.environ.get("TIERGATE_HOME")
    return Path(env) if env else _SOURCE_TREE / ".tiergate"
