"""The `tiergate` command: serve the gateway, run the demo, and the operator tools of every package."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated

import typer
import uvicorn
from pydantic import ValidationError

from tiergate.complexity.cli import classifier_app
from tiergate.core.edge_identity import NODE_ID_PATTERN, node_api_key, node_key
from tiergate.core.serving import head_timeout_protocol
from tiergate.gateway.cache_cli import cache_app
from tiergate.gateway.demo import prepare as prepare_demo
from tiergate.gateway.demo import run_demo
from tiergate.gateway.distill_cli import distill_app
from tiergate.gateway.drain import DrainingServer
from tiergate.gateway.settings import Settings
from tiergate.policies.cli import classify, policy_app
from tiergate.policies.loader import PolicyError, load_policy

_EDGE_SECRET = re.compile(r"[!-~]{32,}")

app = typer.Typer(help="tiergate: an OpenAI-compatible gateway routing between edge, cloud and a semantic cache.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
app.add_typer(policy_app, name="policy", help="Check, explain and simulate routing policies.")
app.add_typer(cache_app, name="cache", help="Semantic cache tools: score pairs, invalidate, export the embedder.")
app.add_typer(classifier_app, name="classifier", help="Train and evaluate the complexity classifier.")
app.add_typer(distill_app, name="distill", help="Export captured answers; train, gate, roll out an edge adapter.")
app.command("classify", help="Classify prompts (JSON lines in) and print one JSON decision per line.")(classify)


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (TIERGATE_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (TIERGATE_PORT).")] = None,
    policy: Annotated[Path | None, typer.Option(help="Policy YAML (TIERGATE_POLICY).")] = None,
    redis_url: Annotated[str | None, typer.Option(help="Redis URL for shared state (TIERGATE_REDIS_URL).")] = None,
    embedder: Annotated[Path | None, typer.Option(help="ONNX embedder dir (TIERGATE_EMBEDDER).")] = None,
    workers: Annotated[int | None, typer.Option(help="Worker processes, each a full gateway (TIERGATE_WORKERS).")] = None,
) -> None:
    """Serve the gateway (uvicorn with uvloop and httptools, each request's head and body on a deadline)."""
    for name, value in (("HOST", host), ("PORT", port), ("POLICY", policy), ("REDIS_URL", redis_url),
                        ("EMBEDDER", embedder), ("WORKERS", workers)):
        if value is not None:
            os.environ[f"TIERGATE_{name}"] = str(value)
    settings = _settings()
    _check_policy(settings.policy)
    if settings.cache and settings.cache_verifier is not None:
        _check_verifier(settings.cache_verifier)
    # proxy_headers=False: the ASGI scope's `client` stays the socket's peer, never an address from X-Forwarded-For
    # (the edge registration's "from this machine" check reads it: gateway.edge_auth)
    if settings.workers > 1:  # each worker is a full gateway; uvicorn's supervisor handles signals (no drain delay)
        uvicorn.run("tiergate.gateway.main:app", host=settings.host, port=settings.port, workers=settings.workers, loop="uvloop",
                    http=head_timeout_protocol(settings.header_timeout_s), log_level="warning", access_log=False,
                    limit_concurrency=settings.max_connections, proxy_headers=False,
                    timeout_graceful_shutdown=int(settings.graceful_shutdown_s))
        return
    from tiergate.gateway.app import create_app  # start-up time: the operator commands need none of the app

    app = create_app(settings)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, loop="uvloop",
                            http=head_timeout_protocol(settings.header_timeout_s), log_level="warning",
                            access_log=False, lifespan="on", limit_concurrency=settings.max_connections,
                            proxy_headers=False)
    DrainingServer(config, app.state.gateway, settings.drain_delay_s, settings.graceful_shutdown_s).run()


def _settings() -> Settings:
    """The TIERGATE_* settings, or exit 2 with one line per problem naming the variable (among them: the demo key
    on a bind address that is not loopback)."""
    try:
        return Settings()
    except ValidationError as exc:
        for err in exc.errors():
            message = str(err["msg"]).removeprefix("Value error, ")
            name = f"TIERGATE_{'_'.join(str(p) for p in err['loc']).upper()}" if err["loc"] else ""
            typer.echo(f"error: {name}: {message}" if name and not message.startswith(name) else f"error: {message}",
                       err=True)
        raise typer.Exit(2) from None


def _check_verifier(path: Path) -> None:
    """A verifier that cannot be loaded is a clear error before the server starts, not a failed start-up."""
    from tiergate.cache.pairscore import (  # start-up time: only with TIERGATE_CACHE_VERIFIER
        PairScorer,
        VerifierError,
    )

    try:
        PairScorer.load(path).close()
    except VerifierError as exc:
        typer.echo(f"error: TIERGATE_CACHE_VERIFIER: {exc}", err=True)
        raise typer.Exit(2) from None


def _check_policy(path: Path) -> None:
    try:
        load_policy(path)
    except PolicyError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


edge_app = typer.Typer(help="Edge node credentials.", no_args_is_help=True)
app.add_typer(edge_app, name="edge")


@edge_app.command("node-key")
def edge_node_key(
    node_id: Annotated[str, typer.Argument(help="The node's id (its --node-id).")],
    secret: Annotated[str | None, typer.Option(envvar="TIERGATE_EDGE_SECRET", show_envvar=True,
                                               help="The gateway's edge secret.")] = None,
) -> None:
    """Print a node's key (derived from the gateway's TIERGATE_EDGE_SECRET), for its TIERGATE_EDGE_NODE_KEY."""
    if not secret or not _EDGE_SECRET.fullmatch(secret):
        typer.echo("error: TIERGATE_EDGE_SECRET: set the gateway's edge secret (at least 32 printable characters "
                   "without spaces, e.g. `openssl rand -hex 32`)", err=True)
        raise typer.Exit(2)
    if not NODE_ID_PATTERN.fullmatch(node_id):
        typer.echo(f"error: node id {node_id!r}: 1-128 letters, digits and `._:-`, starting with a letter or digit",
                   err=True)
        raise typer.Exit(2)
    key = node_key(secret, node_id)
    typer.echo(f"TIERGATE_EDGE_NODE_ID={node_id}\nTIERGATE_EDGE_NODE_KEY={key}\n"
               f"# the node's API key (derived from its node key; the gateway presents it): {node_api_key(key)}")


@app.command()
def prepare() -> None:
    """Build the local demo models and export the ONNX embedder (skipped when already there)."""
    art = prepare_demo()
    typer.echo(f"model: {art.model} ({art.model_path})\ntokenizer: {art.tokenizer}\nembedder: {art.embedder}")


@app.command()
def demo(
    port: Annotated[int, typer.Option(help="Gateway port.")] = 8080,
    edge_nodes: Annotated[int, typer.Option(help="How many local edge nodes to start.")] = 1,
) -> None:
    """Run the whole product on this machine: gateway, edge node(s), cloud stand-in, in-memory cache."""
    raise typer.Exit(run_demo(port=port, edge_nodes=edge_nodes))


if __name__ == "__main__":
    app()
