"""bench/router's results as the docs/benchmarks.md section: every number read from the results of one run."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["HEADING", "markdown"]

HEADING = "## Router (bench/router)"
BASELINES = ("length", "reverse length", "random", "previous design, retrained", "previous shipped model",
             "LiteLLM complexity router")


def _ci(r: dict[str, Any]) -> str:
    return f"{r['apgr']:.3f} [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}]"


def _diff(r: dict[str, Any]) -> str:
    return f"{r['diff']:+.3f} [{r['ci'][0]:+.3f}, {r['ci'][1]:+.3f}]"


def _met(ok: bool) -> str:
    return "met" if ok else "**not met**"


def _pct(v: float) -> str:
    return f"{100 * v:.1f} %"


def _loso_table(r: dict[str, Any]) -> list[str]:
    loso = r["loso"]
    methods = [m for m in BASELINES if m in loso["mean"]]
    lines = ["| held-out source | n | **tiergate complexity** | model - length (paired) | "
             + " | ".join(methods) + " |", "|---|---|---|---|" + "---|" * len(methods)]
    for k, row in loso["sources"].items():
        lines.append(f"| {k} | {row['n']} | **{_ci(row['model'])}** | {_diff(row['model - length'])} | "
                     + " | ".join(_ci(row[m]) for m in methods) + " |")
    mean = loso["mean"]
    lines.append(f"| mean of {len(loso['sources'])} | | **{_ci(mean['model'])}** | {_diff(mean['model - length'])} | "
                 + " | ".join(_ci(mean[m]) for m in methods) + " |")
    return lines


def _targets(r: dict[str, Any]) -> list[str]:
    loso, mm, lat = r["loso"], r["mmlu_in_source"], r["latency"]
    d = loso["mean"]["model - length"]
    below = [k for k, row in loso["sources"].items() if row["model - length"]["ci"][1] < 0]
    shares = r["cloud_share"]["default_policy_mixed_traffic"]["totals"]["sources"]
    outside = {k: v["cloud_share"] for k, v in shares.items() if not 0.2 <= v["cloud_share"] <= 0.4}
    return [
        f"- Mean over sources at least length + 0.04: {_met(d['diff'] >= 0.04)} ({d['diff']:+.3f}, paired 95 % "
        f"interval [{d['ci'][0]:+.3f}, {d['ci'][1]:+.3f}]).",
        "- Not below length beyond its interval on any source (paired interval of model - length entirely below "
        f"0): {_met(not below)}" + (f" (below on {', '.join(below)})." if below else "."),
        f"- MMLU in-source cross-validation (by subject) at least 0.66: {_met(mm['model'] >= 0.66)} "
        f"({mm['model']:.3f}).",
        "- Default policy's cloud share 20-40 % for every source on mixed traffic: "
        f"{_met(not outside)}" + (f" (outside: {outside})." if outside else "."),
        f"- Classification p50 <= 2 ms on one core: {_met(lat['features_p50_ms'] <= 2)} "
        f"({lat['features_p50_ms']} ms wall, {lat['features_cpu_p50_ms']} ms CPU); torch imported: {lat['torch_imported']}, scikit-learn imported: "
        f"{lat['sklearn_imported']}.",
    ]


def _folds(r: dict[str, Any]) -> list[str]:
    lines = ["| held-out source | design chosen on the other sources | their inner mean APGR | mean trust | "
             "trust 0 | complexity >= 0.7 |", "|---|---|---|---|---|---|"]
    for k, f in r["loso"]["folds"].items():
        des = f["design"]
        text = (f"alpha {des['alpha']:g}, {'centred' if des['center'] else 'not centred'}, trusted up to the "
                f"{des['trust_quantile']:g} quantile" + (", + multiple-choice expert" if f["expert"] else ""))
        lines.append(f"| {k} | {text} | {f['inner_mean']:.3f} | {f['mean_trust']:.2f} | "
                     f"{_pct(f['share_trust_0'])} | {_pct(f['share_complexity_ge_0.7'])} |")
    return lines


def _ablations(r: dict[str, Any]) -> list[str]:
    ab = r["ablations"]
    names = [k for k in next(iter(ab.values())) if k != "mean"]
    lines = ["| shipped design, outer folds only | " + " | ".join(names) + " | mean |",
             "|---|" + "---|" * (len(names) + 1)]
    for label, row in ab.items():
        lines.append(f"| {label} | " + " | ".join(f"{row[k]:.3f}" for k in names) + f" | {row['mean']:.3f} |")
    return lines


def _shares(r: dict[str, Any]) -> list[str]:
    sim = r["cloud_share"]["default_policy_mixed_traffic"]
    held = r["cloud_share"]["held_out_complexity_ge_0.7"]
    lines = ["| source | default policy, shipped model (`policy simulate`) | complexity >= 0.7, shipped model "
             "| complexity >= 0.7 under the model that never saw the source |", "|---|---|---|---|"]
    trained = (r["shipped_model"]["trained_on"] or {}).get("sources", {})
    for k, v in sim["totals"]["sources"].items():
        ge = trained.get(k, {}).get("share_complexity_ge_0.7")
        lines.append(f"| {k} | {_pct(v['cloud_share'])} | {_pct(ge) if ge is not None else '-'} | "
                     f"{_pct(held[k]) if k in held else '-'} |")
    rules = ", ".join(f"{k} {v}" for k, v in sim["totals"]["rules"].items())
    lines += ["", f"Rules that fired on the {sim['totals']['decided']} requests: {rules} (prompt tokens counted "
                  f"with `{sim['tokenizer_used']}`)."]
    return lines


def _caveats(r: dict[str, Any]) -> list[str]:
    loso, folds = r["loso"], r["loso"]["folds"]
    src = loso["sources"]
    diffs = {k: row["model - length"] for k, row in src.items()}
    best = max(diffs, key=lambda k: diffs[k]["diff"])
    worst = min((k for k in diffs if k != "mmlu_dev"), key=lambda k: diffs[k]["diff"])
    unseen = [k for k in src if k != "mmlu_dev"]
    prev = sum(src[k]["previous shipped model"]["apgr"] for k in unseen) / len(unseen)
    ours = sum(src[k]["model"]["apgr"] for k in unseen) / len(unseen)
    held = r["cloud_share"]["held_out_complexity_ge_0.7"]
    hi, lo = max(held, key=held.__getitem__), min(held, key=held.__getitem__)
    ab = r["ablations"]
    inv = ab["as shipped"]["mean"] - ab["without the invariance penalty"]["mean"]
    guard = ab["as shipped"]["mean"] - ab["without the shift guard"]["mean"]
    mm = folds.get("mmlu_dev", {})
    lic = (r["shipped_model"]["trained_on"] or {}).get("license", "not recorded")
    return [
        "Where the score still loses, and what was not chosen blind:",
        f"- The gain over length comes from the AlpacaEval subsets (up to {diffs[best]['diff']:+.3f} on {best}); "
        f"on {worst} it is {diffs[worst]['diff']:+.3f} (interval {diffs[worst]['ci'][0]:+.3f} to "
        f"{diffs[worst]['ci'][1]:+.3f}): no better than length. With MMLU held out, "
        f"{_pct(mm.get('share_trust_0', 0))} of its prompts are beyond the trusted region (answer options were "
        f"never seen), so its score there is length's ({diffs['mmlu_dev']['diff']:+.3f}): a tie, not a win. The "
        "shift guard is what keeps it from being worse: without it the same design scores MMLU "
        f"{ab['without the shift guard']['mmlu_dev']:.3f} instead of {ab['as shipped']['mmlu_dev']:.3f}, and the "
        f"mean {guard:.3f} lower.",
        f"- On the {len(unseen)} sources it never saw, the previous shipped model averaged {prev:.3f} against "
        f"{ours:.3f} now; its MMLU figure is in-sample (it was trained on all of mmlu_dev).",
        f"- On a kind of traffic it was not trained on, the share at complexity >= 0.7 is not controlled: "
        f"{_pct(held[hi])} of {hi} and {_pct(held[lo])} of {lo} under the models that never saw them. "
        "Recalibrate (retrain with that traffic as a source) or set the threshold with `policy simulate`.",
        "- Rare request types are not recognised: few proof requests are labelled, so \"Prove that ...\" scores "
        "low; the default policy's `reasoning-request` keyword rule sends it to the cloud.",
        "- Chosen outside the nested protocol: the feature families (written once from the issue's list, then "
        "made faster); the `short` hinge (added after seeing one-word prompts such as \"hi\" scored among the "
        "most complex, and after looking at the gain by prompt length over all chat sources); the trusted "
        f"region's outer limit ({r['shipped_model']['design']['trust_multiple']:g} times the inner one, fixed "
        "after a first version let MMLU through); and the invariance penalty, a requirement of the product (a "
        "threshold should take about the same share of every kind of traffic it was trained on), which costs "
        f"{-inv:.3f} of mean APGR in the ablation above.",
        f"- Data licenses behind the shipped model (recorded in the file, shown by `tiergate policy check`): {lic}",
    ]


def markdown(r: dict[str, Any], source: Path | str) -> str:
    data, lat, mm = r["data"], r["latency"], r["mmlu_in_source"]
    files = ", ".join(f"`{f['name']}` ({f['rows']} rows, sha256 {f['sha256'][:12]})" for f in data["files"])
    shipped = r["shipped_model"]
    sd = shipped["design"]
    lines = [
        HEADING, "",
        f"Command: `.venv/bin/python -m bench.router --write-docs` (this section: `{r['command']}`, results in "
        f"`{source}`). Data: {files} in `{data['dir']}`, {len(data['sources'])} sources (the AlpacaEval subsets "
        "count as sources).", "",
        "Protocol: leave one source out; the design is chosen among "
        f"{r['protocol']['designs_per_selection']} (`complexity/select.py`: ridge penalty, centring, trust "
        "quantile) by leave-one-source-out over the other sources only, trained and calibrated on them "
        "(`tiergate classifier train --select`), then scores the held-out source. APGR as in "
        "`../shared/data/README.md` with fractional labels (random = 0.5); 95 % intervals from "
        f"{r['protocol']['bootstrap_resamples']} bootstrap resamples of the held-out prompts, paired across "
        "methods. Length = WordPiece tokens of the conversation, more escalate first. The previous design is "
        "the former shipped model's (complexity/choice.py) retrained on the same sources; the previous "
        "shipped model is that design trained on all of mmlu_dev (in-sample on MMLU).", "",
        *_loso_table(r), "",
        "Targets:", *_targets(r), "",
        "Designs chosen inside each fold:", "", *_folds(r), "",
        "What each part is worth (fixed shipped design, outer folds, not nested; for orientation only):", "",
        *_ablations(r), "",
        f"MMLU cross-validated by subject ({mm['folds']} folds of its {mm['subjects']} subjects; the other sources "
        f"and the training subjects train, nested design choice), optimistic next to the table above: tiergate "
        f"**{mm['model']:.3f}** (the multiple-choice expert scores these prompts), the generic head alone "
        f"{mm['generic head only']:.3f}, the previous design alone {mm['previous design']:.3f}, length "
        f"{mm['length']:.3f}; complexity >= 0.7 on {_pct(mm['share_complexity_ge_0.7'])} of it.", "",
        *_caveats(r), "",
        f"Cloud share per source. The shipped model (`{shipped['file']}`, sha256 {shipped['sha256'][:12]}, design "
        f"alpha {sd['alpha']:g}, {'centred' if sd['center'] else 'not centred'}, invariance {sd['invariance']:g}, "
        f"trust quantile {sd['trust_quantile']:g}) is calibrated on all six sources, each weighing the same; "
        f"`{r['cloud_share']['default_policy_mixed_traffic']['policy']}` on all labelled prompts as traffic "
        "(`--write-traffic FILE`, then `tiergate policy simulate policies/default.yaml FILE`):", "",
        *_shares(r), "",
        f"Classification latency, one thread, {lat['prompts']} prompts from all sources as chat requests through "
        f"`Classifier.features` (token count + complexity) in a fresh process: p50 **{lat['features_p50_ms']} ms**, "
        f"p90 {lat['features_p90_ms']} ms, p99 {lat['features_p99_ms']} ms wall; CPU time of the classifying thread "
        f"p50 **{lat['features_cpu_p50_ms']} ms**, p99 {lat['features_cpu_p99_ms']} ms (what other jobs on the "
        "machine do not stretch); the complexity score alone p50 "
        f"{lat['complexity_p50_ms']} ms, p99 {lat['complexity_p99_ms']} ms; peak RSS {lat['peak_rss_mib']} MiB."
        + (f" LiteLLM {lat['litellm_version']} `classify` on the same prompts: p50 {lat['litellm_p50_ms']} ms, "
           f"p99 {lat['litellm_p99_ms']} ms." if "litellm_version" in lat else ""), "",
        f"Machine: {r['machine']}; load average {r['load_average']} at the end of the run"
        + (" (other work shared the machine, which stretches the p99s)" if r["load_average"] > (os.cpu_count() or 1)
           else "") + f". Run time {r['seconds']} s.", "",
    ]
    return "\n".join(lines)
