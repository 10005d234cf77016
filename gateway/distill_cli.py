"""`tiergate distill export`, `train`, `gate`, `rollout`: recorded cloud answers to an edge adapter on the fleet.

Each line is one example, `{"messages": [..., {"role": "assistant", "content": ANSWER}]}` (text completions:
`{"prompt": ..., "completion": ...}`), the shape fine-tuning tools read; the manifest says where the records came
from, which filters applied and how many of each kind were written. Both are written mode 0600: they hold
tenants' prompts and answers. `train` and `gate` run `python -m tiergate.training` (the train extra: torch, peft)
in a child process, so this process never imports torch; docs/distill.md is the operator's loop.

Tested in `tests/gateway/test_distill.py`, `tests/gateway/test_rollout.py`, `tests/training/test_pipeline.py`.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import aiohttp
import typer

from tiergate.cache.redis.conn import open_redis, safe_url
from tiergate.gateway.distill import JsonlRecords, RedisRecords, write_private
from tiergate.gateway.rollout import NodeError, load_probes, rollout
from tiergate.gateway.settings import Settings

__all__ = ["distill_app"]

distill_app = typer.Typer(help="Distillation: export recorded cloud answers, train an edge adapter, gate it.",
                          no_args_is_help=True, pretty_exceptions_enable=False)


@distill_app.callback()
def _group() -> None:
    """Keeps the commands subcommands."""


_FORWARD = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


def _training(command: str, args: list[str]) -> None:
    """Run `python -m tiergate.training COMMAND ARGS` in a child process: torch stays out of this process (the
    gateway's CLI), and a missing `train` extra is one clear line."""
    probe = subprocess.run([sys.executable, "-c", "import torch, peft, transformers"], capture_output=True, check=False)
    if probe.returncode != 0:
        typer.echo("error: training needs the train extra: pip install 'tiergate[train]' "
                   "(or scripts/setup.sh --dev)", err=True)
        raise typer.Exit(1)
    raise typer.Exit(subprocess.run([sys.executable, "-m", "tiergate.training", command, *args],
                                    check=False).returncode)


@distill_app.command("train", context_settings=_FORWARD, add_help_option=False)
def train(ctx: typer.Context) -> None:
    """Train a LoRA adapter (GGUF) on an export; `tiergate distill train --help` lists the options."""
    _training("train", ctx.args)


@distill_app.command("gate", context_settings=_FORWARD, add_help_option=False)
def gate(ctx: typer.Context) -> None:
    """Score base and base+adapter in llama.cpp and promote or refuse; `--help` lists the options."""
    _training("gate", ctx.args)


def _example(record: dict[str, Any]) -> dict[str, Any]:
    if "messages" in record:
        return {"messages": [*record["messages"], {"role": "assistant", "content": record["answer"]}]}
    return {"prompt": record.get("prompt", ""), "completion": record["answer"]}


async def _read(redis_url: str | None, file: Path) -> list[dict[str, Any]]:
    if redis_url:
        redis = open_redis(redis_url, socket_timeout=5, socket_connect_timeout=5)
        try:
            return await RedisRecords(redis).all()
        finally:
            await redis.aclose()
    return await JsonlRecords(file).all()


@distill_app.command("export")
def export(
    out: Annotated[Path, typer.Option(help="Training set to write (JSONL); the manifest goes beside it.")],
    redis: Annotated[str | None, typer.Option(help="Redis URL (default: TIERGATE_REDIS_URL; else the local file).")]
    = None,
    file: Annotated[Path | None, typer.Option(help="Local records file (default: TIERGATE_DISTILL_FILE).")] = None,
    tenant: Annotated[list[str] | None, typer.Option(help="Only these tenants (repeatable).")] = None,
    rule: Annotated[list[str] | None, typer.Option(help="Only requests these rules decided (repeatable).")] = None,
    since_hours: Annotated[float | None, typer.Option(help="Only records from the last N hours.")] = None,
    force: Annotated[bool, typer.Option(help="Overwrite an existing output file.")] = False,
) -> None:
    """Write the recorded cloud answers as a chat-format training set and a manifest of what went in."""
    manifest_path = out.with_name(out.name + ".manifest.json")
    if not force and (out.exists() or manifest_path.exists()):
        typer.echo(f"error: {out} exists; pass --force to overwrite it", err=True)
        raise typer.Exit(2)
    url = redis or os.environ.get("TIERGATE_REDIS_URL") or None
    source = file or Settings().distill_file
    try:
        records = asyncio.run(_read(url, source))
    except Exception as exc:  # noqa: BLE001 - any Redis or file failure: one line, exit 1
        typer.echo(f"error: cannot read the records from {safe_url(url) if url else source}: {exc}", err=True)
        raise typer.Exit(1) from None
    horizon = time.time() - since_hours * 3600 if since_hours is not None else None
    kept = [r for r in records if (not tenant or r.get("tenant") in tenant) and (not rule or r.get("rule") in rule)
            and (horizon is None or r.get("ts", 0) >= horizon) and r.get("answer")]
    out.parent.mkdir(parents=True, exist_ok=True)
    write_private(out, "".join(json.dumps(_example(r), ensure_ascii=False) + "\n" for r in kept).encode())
    manifest = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "source": safe_url(url) if url else str(source),
        "filters": {"tenants": tenant or None, "rules": rule or None, "since_hours": since_hours},
        "records_read": len(records), "examples_written": len(kept),
        "by_tenant": dict(Counter(r.get("tenant") for r in kept)),
        "by_rule": dict(Counter(r.get("rule") for r in kept)),
        "by_kind": dict(Counter(r.get("kind") for r in kept)),
        "escalations": sum(1 for r in kept if (r.get("cascade") or {}).get("kept") is False),
        "models": dict(Counter(r.get("model") for r in kept)),
    }
    write_private(manifest_path, (json.dumps(manifest, indent=2) + "\n").encode())
    typer.echo(json.dumps({"out": str(out), "manifest": str(manifest_path), "examples": len(kept)}))


@distill_app.command("rollout")
def rollout_cmd(
    node: Annotated[list[str], typer.Option(help="Edge node base URL (repeatable; the first --canary are canaries).")],
    adapter: Annotated[str, typer.Option(help="Adapter file name, already in every node's --lora-dir.")],
    probes: Annotated[Path, typer.Option(help="Questions with known answers (the gate's heldout.jsonl).")],
    canary: Annotated[int, typer.Option(min=1, help="Nodes swapped first.")] = 1,
    margin: Annotated[float, typer.Option(help="Points the canaries must gain over the other nodes.")] = 0.0,
    previous: Annotated[str | None, typer.Option(help="Adapter to roll back to (default: the plain model).")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="TIERGATE_EDGE_API_KEY", help="The nodes' API key.")] = None,
    max_tokens: Annotated[int, typer.Option(min=1, help="Tokens per probe answer (as the gate's --max-tokens).")]
    = 32,
    out: Annotated[Path | None, typer.Option(help="Write the result JSON here too.")] = None,
) -> None:
    """Swap canary nodes to a gated adapter, compare their answers with the others', then promote or roll back."""
    try:
        questions = load_probes(probes)
        result = asyncio.run(rollout(node, adapter, questions, canary=canary, margin=margin, previous=previous,
                                     api_key=api_key, max_tokens=max_tokens))
    except (ValueError, OSError, NodeError, aiohttp.ClientError, TimeoutError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    body = json.dumps(result.as_dict())
    if out is not None:
        out.write_text(body + "\n")
    typer.echo(body)
    if not result.promoted:
        raise typer.Exit(3)
