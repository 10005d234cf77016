"""PromQL helpers for the deploy tests: the metric names an expression selects, and Grafana's variables."""

from __future__ import annotations

import re

import promql_parser

# Grafana substitutes these before a query reaches Prometheus; use values Prometheus accepts.
_GRAFANA_VARS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h", "$tier": ".*"}


def from_grafana(expr: str) -> str:
    for var, value in _GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    leftover = re.findall(r"\$\{?\w+", expr)
    assert not leftover, f"unknown Grafana variable(s) {leftover} in {expr!r}"
    return expr


def selected_names(expr: str) -> set[str]:
    """Metric names of every vector selector in `expr`, found by walking the parsed expression."""
    names: set[str] = set()

    def walk(node) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            return
        for attr in ("lhs", "rhs", "expr", "vector_selector", "param"):
            child = getattr(node, attr, None)
            if child is not None and not isinstance(child, (str, int, float)):
                walk(child)
        for arg in getattr(node, "args", None) or ():
            walk(arg)

    walk(promql_parser.parse(expr))
    return names
