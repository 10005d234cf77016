"""The routing policy: model of the YAML, loading with precise errors, evaluation, hot reload.

`from policies import load_policy, PolicyEngine, PolicyStore` is the short way in; each lives in its own
module (`policies.loader`, `policies.engine`, `policies.store`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from policies.engine import PolicyEngine
    from policies.loader import PolicyError, load_policy, parse_policy
    from policies.model import Policy
    from policies.store import PolicyStore

__all__ = ["Policy", "PolicyEngine", "PolicyError", "PolicyStore", "load_policy", "parse_policy"]

_WHERE = {
    "Policy": "policies.model",
    "PolicyEngine": "policies.engine",
    "PolicyError": "policies.loader",
    "load_policy": "policies.loader",
    "parse_policy": "policies.loader",
    "PolicyStore": "policies.store",
}


def __getattr__(name: str) -> Any:
    """Lazy re-exports: `import policies.types` stays cheap for packages that only need the shared types."""
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'policies' has no attribute {name!r}")
