"""The metric names tiergate really exposes, collected from the code, for checking rules and dashboards.

Every module of the packages that imports prometheus_client is imported: module-level metrics land in the
default registry, and `*Metrics` classes (edge node, cache) are instantiated on a fresh registry. Names are
expanded the way the exposition format does (counter → _total, histogram → _bucket/_sum/_count).
"""

from __future__ import annotations

import importlib
import inspect
import re
from functools import cache
from pathlib import Path

from prometheus_client import REGISTRY, CollectorRegistry

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "cache", "policies", "cloud_pool", "edge_node")
_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
             "summary": ("_sum", "_count", "_created", ""), "gauge": ("",), "info": ("_info",),
             "stateset": ("",), "gaugehistogram": ("_bucket", "_gsum", "_gcount"), "unknown": ("",)}


def _exposed(registry: CollectorRegistry) -> set[str]:
    names = set()
    for family in registry.collect():
        for suffix in _SUFFIXES.get(family.type, ("",)):
            names.add(family.name + suffix)
    return names


def _metric_modules() -> list[str]:
    mods = []
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            if "prometheus_client" in path.read_text(encoding="utf-8"):
                rel = path.relative_to(REPO).with_suffix("")
                mods.append(".".join(("tiergate", *rel.parts)).removesuffix(".__init__"))
    return mods


@cache
def tiergate_metric_names() -> frozenset[str]:
    """Every sample name the tiergate packages define (tiergate_*)."""
    names: set[str] = set()
    for name in _metric_modules():
        module = importlib.import_module(name)
        for obj in vars(module).values():
            if (inspect.isclass(obj) and obj.__module__ == module.__name__ and obj.__name__.endswith("Metrics")
                    and "registry" in inspect.signature(obj).parameters):
                registry = CollectorRegistry()
                obj(registry=registry)
                names |= _exposed(registry)
    names |= _exposed(REGISTRY)
    return frozenset(n for n in names if n.startswith("tiergate_"))


@cache
def vllm_metric_names() -> frozenset[str]:
    """vLLM's own series the project reads (gateway/pools/vllm_metrics.py), with exposition suffixes."""
    text = (REPO / "gateway" / "pools" / "vllm_metrics.py").read_text(encoding="utf-8")
    base = set(re.findall(r'"(vllm:[a-z_]*[a-z])"', text))
    return frozenset(base | {b + s for b in base for s in ("_total", "_bucket", "_sum", "_count")})
