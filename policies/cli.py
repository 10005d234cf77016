"""Operator commands for policies and classification, mounted into `tiergate` by gateway/cli.py:

    app.add_typer(policy_app, name="policy")          # tiergate policy check|explain|simulate|schema|outcomes
    app.command("classify")(classify)                 # tiergate classify FILE.jsonl|-

Input lines are JSON objects: `prompt` (text completion) or `messages` (chat), and optionally `model`
(default "auto"), `tenant` (default "default"), `priority` (the tenant's, default normal), `headers`,
`stream`, `max_tokens`, `temperature`. A line that cannot be read yields `{"line": N, "error": "..."}` in
its place; the command carries on.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TextIO

import msgspec
import structlog
import typer

from tiergate.complexity.model import DEFAULT_MODEL_FILE, ComplexityModel
from tiergate.complexity.router_train import outcome_record
from tiergate.core.types import Features, Priority
from tiergate.core.wire import ChatRequest, CompletionRequest
from tiergate.policies.cascade_sim import describe_cascade
from tiergate.policies.classify import Classifier, messages_of
from tiergate.policies.costs import Throughput
from tiergate.policies.engine import PolicyEngine
from tiergate.policies.loader import DEFAULT_POLICY, PolicyError, check_policy, load_policy
from tiergate.policies.model import Policy
from tiergate.policies.router_config import offline_router
from tiergate.policies.servers import read_contexts
from tiergate.policies.simulate import Simulation
from tiergate.policies.store import policy_version

__all__ = ["SCHEMA_FILE", "classify", "policy_app", "schema_text"]

SCHEMA_FILE = Path(__file__).resolve().parent / "schema.json"

policy_app = typer.Typer(help="Check, explain and simulate routing policies.", no_args_is_help=True,
                         pretty_exceptions_enable=False)


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


# -------------------------------------------------------------------------------------------- helpers


@dataclass(frozen=True)
class _Loaded:
    policy: Policy
    engine: PolicyEngine
    version: str


class _Source:
    """A fixed policy in the shape the Classifier reads (`.current.policy`)."""

    def __init__(self, loaded: _Loaded) -> None:
        self.current = loaded


class _StderrLogger:
    """Writes to whatever sys.stderr is at the time of the call (never a stream captured at set-up)."""

    def msg(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    log = debug = info = warn = warning = error = critical = exception = fatal = msg


def _quiet_logs() -> None:
    """Warnings (a tokenizer fallback, ...) go to stderr as plain lines, so stdout stays pure JSON lines.

    Only when nothing configured structlog yet: a host process (the gateway, a test run) keeps its own set-up.
    """
    if structlog.is_configured():
        return
    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.dev.ConsoleRenderer(colors=False)],
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=lambda *_args: _StderrLogger(),
        cache_logger_on_first_use=False,
    )


def _load(path: Path) -> _Loaded:
    _quiet_logs()
    try:
        policy = load_policy(path)
    except PolicyError as exc:
        raise _fail(str(exc)) from None
    return _Loaded(policy, PolicyEngine(policy), policy_version(path.read_bytes()))


def _classifier(loaded: _Loaded) -> Classifier:
    return Classifier(_Source(loaded))


def _request(obj: Any) -> tuple[Any, str, Any, dict[str, str]]:
    """(ParsedRequest, tenant, tenant priority, headers) from one input object; ValueError says what is wrong."""
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object with `prompt` or `messages`")
    body: dict[str, Any] = {"model": obj.get("model", "auto")}
    for key in ("stream", "max_tokens", "temperature"):
        if obj.get(key) is not None:
            body[key] = obj[key]
    try:
        if "messages" in obj:
            req: Any = msgspec.convert({**body, "messages": obj["messages"]}, ChatRequest)
        elif "prompt" in obj:
            req = msgspec.convert({**body, "prompt": obj["prompt"]}, CompletionRequest)
        else:
            raise ValueError("expected `prompt` (text) or `messages` (chat)")
    except msgspec.ValidationError as exc:
        raise ValueError(str(exc)) from None
    tenant = obj.get("tenant", "default")
    if not isinstance(tenant, str) or not tenant:
        raise ValueError("`tenant` must be a non-empty string")
    priority = Priority.parse(obj.get("priority", "normal"))
    headers = obj.get("headers") or {}
    if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise ValueError("`headers` must map names to string values")
    return req, tenant, priority, {k.lower(): v for k, v in headers.items()}


def _lines(source: TextIO) -> Iterator[tuple[int, Any]]:
    """(line number, parsed JSON or an Exception) for every non-blank line."""
    for n, line in enumerate(source, 1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except ValueError as exc:
            yield n, ValueError(f"not JSON: {exc}")


def _open(path: str) -> TextIO:
    if path == "-":
        return sys.stdin
    try:
        return open(path, encoding="utf-8", errors="replace")
    except OSError as exc:
        raise _fail(f"cannot read {path}: {exc.strerror or exc}") from None


def _classify_line(clf: Any, engine: Any, obj: Any,
                   predict: Callable[[Features], Features] | None = None) -> tuple[Any, Any, Any]:
    """(request, features, decision) for one input object, or raises ValueError; `predict` adds the learned
    router's edge_success."""
    if isinstance(obj, Exception):
        raise obj
    req, tenant, priority, headers = _request(obj)
    try:
        features = clf.features(req, tenant, priority, headers)
    except Exception as exc:  # the priority header's bad_request, a tokenizer failure, ...
        raise ValueError(getattr(exc, "message", None) or str(exc)) from None
    if predict is not None:
        features = predict(features)
    return req, features, engine.decide(features)


def _emit(obj: dict[str, Any], out: TextIO) -> None:
    out.write(json.dumps(obj, ensure_ascii=False) + "\n")


# ----------------------------------------------------------------------------------------- commands


@policy_app.command("check")
def check(
    file: Annotated[Path, typer.Argument(help="Policy YAML file.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    servers: Annotated[bool, typer.Option(help="Read each tier's real context from its endpoints' /v1/models and "
                                               "warn when `max_context` is larger.")] = True,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each endpoint.")] = 3.0,
) -> None:
    """Validate a policy; exit 0 when it would load (warnings are printed), 2 with every problem when not.

    With `--servers` (the default), each tier's static endpoints are asked for their context (`max_model_len`);
    a tier promising more than a server serves is a warning, an endpoint that does not answer a note.
    """
    try:
        data = file.read_bytes()
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _fail(f"cannot read {file}: {getattr(exc, 'strerror', None) or exc}") from None
    policy, problems = check_policy(text, str(file), file.resolve().parent)
    contexts = read_contexts(policy, timeout) if policy is not None and servers else []
    model = _model_provenance(policy) if policy is not None else None
    if as_json:
        typer.echo(json.dumps({"ok": policy is not None, "version": policy_version(data) if policy else None,
                               "problems": [{"line": p.line, "column": p.column, "field": p.field,
                                             "message": p.message, "severity": p.severity} for p in problems],
                               "servers": [{"tier": c.tier, "endpoint": c.endpoint, "max_context": c.max_context,
                                            "context": c.context, "error": c.error, "too_small": c.too_small}
                                           for c in contexts],
                               "complexity_model": model,
                               "costs": policy.costs.model_dump() if policy is not None and policy.costs else None}))
        raise typer.Exit(0 if policy is not None else 2)
    for p in problems:
        typer.echo(str(p), err=p.severity == "error")
    for c in contexts:
        typer.echo(c.describe())
    if policy is None:
        n = sum(p.severity == "error" for p in problems)
        raise _fail(f"{file} is invalid: {n} problem{'s' if n > 1 else ''}; the gateway would keep its last good policy")
    rules = len(policy.effective_rules())
    typer.echo(f"ok: {file} (version {policy_version(data)}, {len(policy.tiers)} tiers, {rules} rules)")
    if model is not None:
        for line in _describe_model(model):
            typer.echo(line)
    for line in _describe_costs(policy):
        typer.echo(line)


def _describe_costs(policy: Policy) -> list[str]:
    """The cost model as `policy check` shows it: each tier's prices per 1,000 tokens and the reference tier."""
    c = policy.costs
    if c is None:
        return ["costs: none (no `costs` section: spend and savings are not counted)"]
    out = [f"costs: {c.currency} per 1,000 tokens (prompt / cached prompt / completion); savings against "
           f"{c.reference_tier!r}"]
    for name in policy.tiers:
        p = c.tier_price(name)
        line = f"  {name}: " + (f"{_price(p.prompt_per_1k)} / {_price(p.cached_prompt)} / "
                                f"{_price(p.completion_per_1k)}" if p is not None else "no prices (counted as 0)")
        node, found = c.prices[name].node if name in c.prices else None, c.throughput(name)
        if node is not None and found is not None:
            source = ("measured live by its nodes; until one reports, the benchmark figure" if
                      node.throughput is Throughput.LIVE else "the benchmark figure in this policy")
            line += (f"  (derived: {_price(node.per_second)} per node-second / {found[0]:g} tokens/s; "
                     f"throughput: {source})")
        out.append(line)
    return out


def _price(v: float) -> str:
    return f"{v:.10f}".rstrip("0").rstrip(".") or "0"


def _model_provenance(policy: Policy) -> dict[str, Any]:
    """Which complexity model the policy uses and what it was trained on (the file's own record)."""
    own = policy.complexity_model is not None
    path = policy.resolve_path(policy.complexity_model) if policy.complexity_model is not None else DEFAULT_MODEL_FILE
    try:
        info = ComplexityModel.provenance(path)
    except ValueError as exc:
        return {"path": str(path), "shipped": not own, "error": str(exc)}
    return {**info, "shipped": not own}


def _describe_model(m: dict[str, Any]) -> list[str]:
    which = "the shipped default" if m["shipped"] else "set by complexity_model"
    if "error" in m:
        return [f"complexity model: {m['path']} ({which}): {m['error']}"]
    sources = ", ".join(f"{k} {n}" for k, n in m["sources"].items()) or "not recorded"
    files = ", ".join(f"{f['name']} (sha256 {str(f['sha256'])[:12]})" for f in m["files"]) or "not recorded"
    expert = "; with the multiple-choice expert" if m["multiple_choice_expert"] else ""
    return [f"complexity model: {m['path']} ({which}, {m['format']}{expert})",
            f"  trained on {m['rows']} prompts from {len(m['sources'])} sources: {sources}",
            f"  files: {files}",
            f"  license: {m['license']}"]


@policy_app.command("explain")
def explain(
    file: Annotated[Path, typer.Argument(help="Policy YAML file.")],
    prompt: Annotated[str, typer.Option(help="The prompt text (sent as one user message).")],
    priority: Annotated[str, typer.Option(help="The tenant's priority: low, normal, high, critical.")] = "normal",
    tenant: Annotated[str, typer.Option(help="Tenant id.")] = "default",
    model: Annotated[str, typer.Option(help="Requested model (auto lets the policy choose).")] = "auto",
    header: Annotated[list[str] | None, typer.Option(help="Request header NAME=VALUE (repeatable).")] = None,
    stream: Annotated[bool, typer.Option(help="A streaming request.")] = False,
    temperature: Annotated[float | None, typer.Option(help="Sampling temperature.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the explanation as JSON.")] = False,
) -> None:
    """Show the features of a request, every rule tried with why it matched or not, and the decision."""
    loaded = _load(file)
    headers: dict[str, str] = {}
    for h in header or []:
        name, sep, value = h.partition("=")
        if not sep or not name.strip():
            raise _fail(f"--header {h!r}: expected NAME=VALUE")
        headers[name.strip().lower()] = value.strip()
    obj: dict[str, Any] = {"messages": [{"role": "user", "content": prompt}], "model": model, "tenant": tenant,
                           "priority": priority, "headers": headers, "stream": stream, "temperature": temperature}
    clf = _classifier(loaded)
    try:
        req, features, _ = _classify_line(clf, loaded.engine, obj)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    ex = loaded.engine.explain(features)
    counter = clf.counter_for(loaded.policy, model)
    detail = clf.complexity_model(loaded.policy).explain(messages_of(req))
    if as_json:
        out = ex.to_dict()
        out["features"]["tokenizer"] = counter.spec_used
        out["complexity"] = detail
        typer.echo(json.dumps(out, indent=2))
        return
    f = features
    typer.echo(f"policy {file} (version {loaded.version})")
    typer.echo("features:")
    typer.echo(f"  prompt_tokens  {f.prompt_tokens}  (tokenizer {counter.spec_used})")
    typer.echo(f"  complexity     {f.complexity:.3f}  ({_complexity_detail(detail)})")
    typer.echo(f"  priority       {f.priority.name.lower()}")
    typer.echo(f"  model          {f.requested_model}    tenant {f.tenant}    stream {str(f.stream).lower()}")
    typer.echo("rules:")
    for t in ex.tried:
        mark = {"matched": "=>", "no match": "  ", "not reached": "  "}[t.outcome]
        typer.echo(f"{mark} {t.rule}: {t.outcome}")
        if not t.checks:
            typer.echo("      (no conditions: matches every request)")
        for c in t.checks:
            typer.echo(f"      [{'x' if c.held else ' '}] {c.condition}   ({c.observed})")
    d = ex.decision
    if d.reject is not None:
        retry = f", Retry-After {d.reject.retry_after_s}s" if d.reject.retry_after_s is not None else ""
        typer.echo(f"decision: reject {d.reject.status} {d.reject.message!r}{retry} (rule {d.rule})")
    else:
        chain = " -> ".join(d.tiers)
        cache = "off" if not d.cache.enabled else (
            f"on (semantic {'on' if d.cache.semantic else 'off'}, threshold {d.cache.threshold}, ttl {d.cache.ttl_s}s)")
        typer.echo(f"decision: {chain} (rule {d.rule}); cache {cache}; max_tokens cap {d.max_tokens_cap}")
        if d.cascade is not None:
            typer.echo(f"cascade: {describe_cascade(d.tier or '', d.cascade)}")


def _complexity_detail(d: dict[str, Any]) -> str:
    """How the score came about, in one line: who scored it, how far from the training prompts, the prior."""
    scorer = f"{d['scored_by']} z {d['model_z']:+.2f}"
    if d["trust"] >= 1.0:
        trust = f"trusted: distance {d['distance']:.1f} <= {d['trusted_up_to']:.1f}"
    elif d["trust"] <= 0.0:
        trust = f"unlike the training prompts: distance {d['distance']:.1f} >= {d['untrusted_from']:.1f}, " \
                "scored by length alone"
    else:
        trust = f"trust {d['trust']:.2f}: distance {d['distance']:.1f} between {d['trusted_up_to']:.1f} and " \
                f"{d['untrusted_from']:.1f}"
    top = ", ".join(f"{k} {v:+.2f}" for k, v in list(d["top_contributions"].items())[:3])
    return f"{scorer}, length z {d['length_z']:+.2f}; {trust}; largest head terms: {top}"


@policy_app.command("simulate")
def simulate(
    file: Annotated[Path, typer.Argument(help="Policy YAML file.")],
    traffic: Annotated[str, typer.Argument(help="Traffic as JSON lines (- for stdin); a line may name its "
                                                "`source` (kind of traffic) for per-source totals and its "
                                                "`completion_tokens` for its cost.")],
    compare: Annotated[Path | None, typer.Option(help="A second policy: print both side by side (routing, cost, "
                                                      "savings) instead of the per-request lines.")] = None,
    assumed_completion: Annotated[int, typer.Option(min=0, help="Completion tokens of a line that gives neither "
                                                               "completion_tokens nor max_tokens.")] = 256,
    as_json: Annotated[bool, typer.Option("--json", help="With --compare: the two totals as one JSON object.")]
    = False,
    edge_version: Annotated[str | None, typer.Option(help="The edge model version whose learned router decides "
                                                          "(default: the edge tier's served model).")] = None,
) -> None:
    """Decide every request of a traffic file: one JSON line per request, then a {"totals": ...} line (its `cost`:
    spend, what all-cloud would have cost, and what the edge, the cache and the cascade saved, in the policy's
    own prices). With --compare, two policies on the same traffic, side by side. With a `router` section, the
    learned router's model predicts `edge_success` as the gateway would."""
    source = _open(traffic)
    try:
        lines = list(_lines(source))
    finally:
        if source is not sys.stdin:
            source.close()
    if compare is None:
        sim = _simulate(_load(file), lines, assumed_completion, sys.stdout, edge_version)
        _emit({"totals": sim.totals()}, sys.stdout)
        return
    both = [(path, loaded, _simulate(loaded, lines, assumed_completion, None, edge_version).totals())
            for path, loaded in ((file, _load(file)), (compare, _load(compare)))]
    if as_json:
        typer.echo(json.dumps({"traffic": traffic, "policies": [
            {"file": str(path), "version": loaded.version, "totals": totals} for path, loaded, totals in both]},
            indent=2))
        return
    for line in side_by_side([(str(path), totals) for path, _, totals in both]):
        typer.echo(line)


def _simulate(loaded: _Loaded, lines: list[tuple[int, Any]], assumed_completion: int,
              out: TextIO | None, edge_version: str | None = None) -> Simulation:
    """Decide every line under one policy; each row written to `out` (None: totals only)."""
    clf = _classifier(loaded)
    policy = loaded.policy
    try:
        version, predict = offline_router(
            policy.router, policy.resolve_path(policy.router.model) if policy.router else Path(),
            {n: (t.kind, t.served_model or t.model) for n, t in policy.tiers.items()}, edge_version)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    sim = Simulation(policy, assumed_completion,
                     router=(version, predict is not None) if policy.router is not None else None)
    for n, obj in lines:
        try:
            _, f, d = _classify_line(clf, loaded.engine, obj, predict)
        except ValueError as exc:
            sim.error()
            if out is not None:
                _emit({"line": n, "error": str(exc)}, out)
            continue
        label = obj.get("source")  # a dict here: _classify_line refused anything else
        row = sim.row(f, d, str(label) if label is not None else None, obj.get("cascade"), obj)
        if out is not None:
            _emit({"line": n, **row}, out)
    return sim


def side_by_side(runs: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Two (or more) policies' totals as a table: routing, then cost and savings, then the quality they cost."""
    def share(t: dict[str, Any], kind: str) -> str:
        return f"{t['kinds'].get(kind, {}).get('share', 0.0):.1%}"

    def money(t: dict[str, Any], *path: str) -> str:
        c: Any = t.get("cost")
        for key in path:
            c = c.get(key) if isinstance(c, dict) else None
        return "-" if c is None else f"{c:.6f}"

    def kept(t: dict[str, Any]) -> str:
        rules = t["cascade"]["rules"]
        judged = sum(r["with_confidence"] for r in rules.values())
        return f"{sum(r['kept'] for r in rules.values()) / judged:.1%} of {judged}" if judged else "-"

    currency = next((t["cost"]["currency"] for _, t in runs if "cost" in t), "")
    rows: list[tuple[str, list[str]]] = [
        ("requests decided", [str(t["decided"]) for _, t in runs]),
        ("edge share", [share(t, "edge") for _, t in runs]),
        ("cloud share", [share(t, "cloud") for _, t in runs]),
        ("rejected", [f"{t['rejected']['share']:.1%}" for _, t in runs]),
        ("cache: exact repeats", [f"{t['cache']['exact_repeat_share']:.1%}" for _, t in runs]),
        (f"spend ({currency})", [money(t, "spend") for _, t in runs]),
        (f"all-cloud reference ({currency})", [money(t, "reference") for _, t in runs]),
        (f"saved ({currency})", [money(t, "saved") for _, t in runs]),
        ("saved share", [f"{t['cost']['saved_share']:.1%}" if "cost" in t else "-" for _, t in runs]),
        *[(f"  saved by {s}", [money(t, "saved_by", s) for _, t in runs]) for s in ("edge", "cache", "cascade",
                                                                                   "cloud")],
        ("quality: cascade kept", [kept(t) for _, t in runs]),
        ("quality: escalated (of all)", [f"{t['cascade']['escalated_share_of_all']:.1%}" for _, t in runs]),
        ("completion tokens assumed", [str(t["cost"]["completion_tokens_assumed"]) if "cost" in t else "-"
                                       for _, t in runs]),
    ]
    names = [name for name, _ in runs]
    width = max(len(label) for label, _ in rows) + 2
    cols = [max(len(n), *(len(r[1][i]) for r in rows)) + 2 for i, n in enumerate(names)]
    out = [" " * width + "".join(n.rjust(c) for n, c in zip(names, cols, strict=True))]
    out += [label.ljust(width) + "".join(v.rjust(c) for v, c in zip(values, cols, strict=True))
            for label, values in rows]
    return out


def schema_text() -> str:
    """The JSON Schema of the policy file, as shipped in policies/schema.json."""
    schema = Policy.model_json_schema(by_alias=True)
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema",
              "$id": "https://tiergate.dev/schemas/policy.json", **schema}
    schema["title"] = "tiergate routing policy"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


@policy_app.command("schema")
def schema(
    out: Annotated[Path | None, typer.Option(help="Write to this file instead of stdout.")] = None,
    check_file: Annotated[Path | None, typer.Option("--check", help="Exit 1 if this file is out of date.")] = None,
) -> None:
    """Print the policy's JSON Schema (for editors: `# yaml-language-server: $schema=...`)."""
    text = schema_text()
    if check_file is not None:
        try:
            current = check_file.read_text()
        except OSError:
            current = ""
        if current != text:
            raise _fail(f"{check_file} is out of date: run `tiergate policy schema --out {check_file}`", 1)
        typer.echo(f"ok: {check_file} is up to date")
        return
    if out is not None:
        out.write_text(text)
        typer.echo(f"wrote {out}")
    else:
        typer.echo(text, nl=False)


@policy_app.command("outcomes")
def outcomes(
    file: Annotated[Path, typer.Argument(help="Policy YAML file (its tokenizers and complexity model).")],
    graded: Annotated[str, typer.Argument(help="Graded traffic as JSON lines (- for stdin): `prompt` or "
                                               "`messages`, `stood` (true: the edge's answer was right), optional "
                                               "`edge_version`, `tenant`.")],
    edge_version: Annotated[str | None, typer.Option(help="The edge model version graded, for lines that name "
                                                          "none.")] = None,
) -> None:
    """Graded traffic as outcome records for `tiergate classifier train --from-outcomes`: the router's features
    computed as the gateway computes them, no prompt text. Graded labels teach what the cascade's confidence
    cannot see (an edge guessing fluently is kept by the cascade, and recorded as standing)."""
    loaded = _load(file)
    clf = _classifier(loaded)
    source = _open(graded)
    bad = 0
    try:
        for n, obj in _lines(source):
            try:
                _, f, d = _classify_line(clf, loaded.engine, obj)
                stood, version = obj.get("stood"), obj.get("edge_version", edge_version)
                if not isinstance(stood, bool) or not isinstance(version, str) or not version:
                    raise ValueError("needs `stood` (true/false) and an edge version (`edge_version` or "
                                     "--edge-version)")
            except ValueError as exc:
                bad += 1
                typer.echo(f"{graded}:{n}: skipped: {exc}", err=True)
                continue
            _emit(outcome_record(f, stood=stood, edge_version=version, tenant=f.tenant, rule=d.rule,
                                 reason="graded", source="graded"), sys.stdout)
    finally:
        if source is not sys.stdin:
            source.close()
    if bad:
        raise typer.Exit(1)


def classify(
    file: Annotated[str, typer.Argument(help="JSON lines with `prompt` or `messages` (- for stdin).")] = "-",
    policy: Annotated[Path, typer.Option(help="Policy YAML file.")] = DEFAULT_POLICY,
) -> None:
    """Classify prompts: one JSON line out per line in (tier, rule, complexity, prompt_tokens), in order."""
    loaded = _load(policy)
    clf = _classifier(loaded)
    source = _open(file)
    try:
        for n, obj in _lines(source):
            try:
                _, f, d = _classify_line(clf, loaded.engine, obj)
            except ValueError as exc:
                _emit({"line": n, "error": str(exc)}, sys.stdout)
                continue
            row: dict[str, Any] = {"line": n, "tier": d.tier, "rule": d.rule, "complexity": round(f.complexity, 4),
                                   "prompt_tokens": f.prompt_tokens, "priority": f.priority.name.lower(),
                                   "fallbacks": list(d.fallbacks)}
            if d.reject is not None:
                row["reject"] = d.reject.status
            _emit(row, sys.stdout)
    finally:
        if source is not sys.stdin:
            source.close()
