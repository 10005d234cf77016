"""`python -m tiergate.training` (`tiergate distill train` and `tiergate distill gate` run it): train and gate.

Tested in `tests/training/test_pipeline.py`, `tests/training/test_cli.py`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from tiergate.training.converters import ConversionError, convert_lora
from tiergate.training.data import Example, ExportError, dedupe, file_digest, load_export, split
from tiergate.training.gate import decide, evaluate
from tiergate.training.lora import (
    TokenizerMismatch,
    TrainConfig,
    chat_texts,
    check_tokenizer,
    load_base,
    save_base,
    train_lora,
)

__all__ = ["app"]

app = typer.Typer(help="Distillation: train a LoRA adapter on captured answers, and gate it.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
REFUSED = 3  # the gate's exit status for a refused candidate (errors exit 1 or 2)


def _write_jsonl(path: Path, rows: list[Example]) -> None:
    text = "".join(json.dumps({"messages": [*ex.chat, {"role": "assistant", "content": ex.answer}]},
                              ensure_ascii=False) + "\n" for ex in rows)
    path.write_text(text, encoding="utf-8")
    path.chmod(0o600)  # tenants' prompts and answers


def _load(path: Path) -> list[Example]:
    try:
        return load_export(path)
    except (ExportError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


@app.command()
def train(
    export: Annotated[Path, typer.Argument(help="Training set written by `tiergate distill export`.")],
    model: Annotated[Path, typer.Option(help="The GGUF the fleet runs (the adapter is trained on it).")],
    out: Annotated[Path, typer.Option(help="Output folder: adapter.gguf, its manifest, the held-out slice.")],
    steps: Annotated[int | None, typer.Option(min=1, help="Stop after N optimizer steps (default: --epochs).")]
    = None,
    epochs: Annotated[float, typer.Option(min=0.01)] = 2.0,
    rank: Annotated[int, typer.Option(min=1)] = 16,
    lr: Annotated[float, typer.Option(min=0)] = 1e-3,
    batch_size: Annotated[int, typer.Option(min=1)] = 8,
    heldout_share: Annotated[float, typer.Option(min=0.0, max=0.9, help="Share of rows held out.")] = 0.2,
    newest_share: Annotated[float, typer.Option(min=0.0, max=0.9, help="Newest rows always held out.")] = 0.1,
    threads: Annotated[int, typer.Option(min=1)] = 1,
    resume: Annotated[bool, typer.Option(help="Continue from the checkpoint in --out if there is one.")] = True,
) -> None:
    """Deduplicate, hold out by time and cluster, train a LoRA on the GGUF's weights, write it as a GGUF adapter."""
    if not model.is_file():
        typer.echo(f"error: --model {model}: no such file", err=True)
        raise typer.Exit(2)
    rows = dedupe(_load(export))
    parts = split(rows, heldout_share, newest_share)
    if not parts.train:
        typer.echo(f"error: {export}: no training rows left after deduplication and the held-out split "
                   f"({len(rows)} unique rows)", err=True)
        raise typer.Exit(2)
    out.mkdir(parents=True, exist_ok=True)
    _write_jsonl(out / "heldout.jsonl", parts.heldout)
    cfg = TrainConfig(rank=rank, alpha=2 * rank, lr=lr, epochs=epochs, batch_size=batch_size, threads=threads)
    t0 = time.monotonic()
    typer.echo(f"loading {model} into torch", err=True)
    base, tok = load_base(model)
    try:
        check_tokenizer(model, tok, chat_texts(tok, parts.train[:32]))
    except TokenizerMismatch as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    base_dir = save_base(base, tok, out / "base-hf")
    with Progress(TextColumn("training"), BarColumn(), MofNCompleteColumn(), TextColumn("loss {task.fields[loss]}"),
                  TimeRemainingColumn()) as bar:
        task = bar.add_task("train", total=None, loss="-")

        def tick(step: int, total: int, loss: float) -> None:
            bar.update(task, completed=step, total=total, loss=f"{loss:.3f}")

        adapter_dir = train_lora(base, tok, parts.train, cfg, out, resume=resume, max_steps=steps, progress=tick,
                                 say=lambda m: typer.echo(m, err=True))
    try:
        artifact = convert_lora(adapter_dir, base_dir, out / "adapter.gguf")
    except ConversionError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    manifest = {
        "adapter": artifact.name, "adapter_sha256": file_digest(artifact),
        "base_model": str(model.resolve()), "base_sha256": file_digest(model),
        "data": {"export": str(export), "sha256": file_digest(export), "unique_rows": len(rows),
                 "train_rows": len(parts.train), "heldout_rows": len(parts.heldout)},
        "training": {**cfg.as_dict(), **json.loads((adapter_dir / "training.json").read_text())},
        "wall_s": round(time.monotonic() - t0, 1),
    }
    (out / "adapter.gguf.manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    typer.echo(json.dumps({"adapter": str(artifact), "heldout": str(out / "heldout.jsonl"),
                           "train_rows": len(parts.train), "heldout_rows": len(parts.heldout)}))


@app.command()
def gate(
    model: Annotated[Path, typer.Option(help="The GGUF the fleet runs now.")],
    adapter: Annotated[Path, typer.Option(help="The candidate GGUF adapter.")],
    heldout: Annotated[Path, typer.Option(help="Held-out slice (train's heldout.jsonl).")],
    regression: Annotated[Path, typer.Option(help="Fixed general regression set (export format).")],
    out: Annotated[Path, typer.Option(help="Verdict JSON to write.")],
    margin: Annotated[float, typer.Option(help="Held-out points the candidate must gain.")] = 5.0,
    max_regression: Annotated[float, typer.Option(min=0, help="Regression-set points it may lose.")] = 2.0,
    max_tokens: Annotated[int, typer.Option(min=1)] = 32,
) -> None:
    """Score base and base+adapter in llama.cpp; promote (exit 0) or refuse with the reason (exit 3)."""
    for name, path in (("--model", model), ("--adapter", adapter)):
        if not path.is_file():
            typer.echo(f"error: {name} {path}: no such file", err=True)
            raise typer.Exit(2)
    held, reg = _load(heldout), _load(regression)
    scores: dict[str, dict] = {"heldout": {}, "regression": {}}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn()) as bar:
        task = bar.add_task("gate", total=4)
        for side, rows in (("heldout", held), ("regression", reg)):
            for who, lora in (("base", None), ("candidate", adapter)):
                bar.update(task, description=f"{side}: {who}")
                scores[side][who] = evaluate(model, rows, lora, max_tokens=max_tokens)
                bar.advance(task)
    verdict = decide(scores["heldout"], scores["regression"], margin, max_regression)
    body = {**verdict.as_dict(), "model": str(model), "adapter": str(adapter), "adapter_sha256": file_digest(adapter)}
    out.write_text(json.dumps(body, indent=2) + "\n")
    typer.echo(json.dumps({"promote": verdict.promote, "reason": verdict.reason, "verdict": str(out)}))
    if not verdict.promote:
        raise typer.Exit(REFUSED)
