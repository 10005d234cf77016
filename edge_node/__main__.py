"""`python -m tiergate.edge_node ...` is the `edge-node` command."""

from tiergate.edge_node.cli import app

app()
