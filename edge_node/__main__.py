"""`python -m edge_node ...` is the `edge-node` command."""

from edge_node.cli import app

app()
