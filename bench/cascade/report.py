"""bench/cascade's tables, as Markdown: printed by the run and written to docs/benchmarks.md's section.

Every number comes from the result dict of the same run (bench/results/cascade.json); the prose around the
tables states only what the numbers say or how they were made.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SECTION", "findings", "markdown"]

SECTION = "## Cascade (bench/cascade)"

TASK_TITLES = {
    "capital": "capital of a country", "country": "country of a capital", "add_1d": "1-digit sums",
    "mul_1d": "1-digit products", "add_2d": "2-digit sums", "mul_2x1d": "2-digit x 1-digit products",
    "mmlu": "MMLU (control)",
}
SHOWN_AUROC = ("mean logprob", "min logprob", "first-3 mean logprob", "mean margin", "prompt tokens", "complexity")


def _f(x: Any, nd: int = 2, pct: bool = False) -> str:
    if x is None:
        return "—"
    return f"{x * 100:.{max(nd - 2, 0)}f} %" if pct else f"{x:.{nd}f}"


def _ci(lo_hi: list[Any], nd: int = 2, pct: bool = False) -> str:
    if not lo_hi or lo_hi[0] is None:
        return ""
    lo, hi = lo_hi
    return f" ({lo * 100:.0f}-{hi * 100:.0f} %)" if pct else f" ({lo:.{nd}f}-{hi:.{nd}f})"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in rows)]


def markdown(res: dict[str, Any]) -> str:
    m, s, ov = res["machine"], res["settings"], res["overall"]
    rec = res["recommended"]
    lines = [
        SECTION, "",
        f"Command: `{res['command']}` ({res['wall_s'] / 60:.0f} minutes here). Writes `{res['result_file']}` "
        "(every answer, its signals and timings, and every number below); `--render bench/results/cascade.json` "
        "prints these tables again from it.",
        "",
        f"Setup: the real edge model, `edge-node serve --model smollm2-135m-instruct {res['edge']['args']}` "
        f"(SmolLM2-135M-Instruct Q4_1), asked over HTTP as the gateway asks it: streamed chat completions, greedy "
        f"(temperature 0), `max_tokens` {s['max_tokens']}, `top_logprobs` 2, {s['concurrency']} request in flight. "
        f"Machine: {m['cpu_model']}, {m['cores']} cores shared with other work (1-minute load average {m['load_start']:.1f} "
        f"at the start, {m.get('load_after_edge_answers', float('nan')):.1f} after the edge answers, {m['load_end']:.1f} "
        f"at the end), {m['mem_gib']:.0f} GiB; no GPU. Seed {s['seed']}; "
        f"{ov['n']} questions, halved per task into calibration ({ov['n_calibration']}) and evaluation "
        f"({ov['n_evaluation']}); bootstrap intervals from {s['reps']} resamples of the evaluation half.",
        "",
        "Data (exact checkers in `bench/cascade/check.py`: the numbers in an answer less the question's operands "
        "must all equal the gold; an answer must name the gold capital or country and no other; MMLU's first "
        "standalone letter A-D):",
    ]
    for d in res["data"]:
        lines.append(f"- {d['tasks']}: {d['source']} ({d['license']}).")
    lines += ["", "### The edge model's answers, per task", "",
              "AUROC: how well a signal separates right from wrong edge answers (0.5 = no better than chance; "
              "prompt signals are oriented so that a shorter / less complex prompt predicts a right answer). "
              "All of a task's questions; — where the edge was always right or always wrong. The last two columns "
              "apply the 5 % threshold chosen on the calibration half (below) to all of the task's questions: the "
              "share kept on the edge, and the share kept although wrong.", ""]
    head = ["task", "n", "edge right", "cut at max_tokens", "prompt tokens"]
    if "stand_in" in res:
        head.append("stand-in right")
    head += [f"AUROC {k}" for k in SHOWN_AUROC]
    head += [f"kept at the {rec['hold_signal']} 5 % threshold", "kept and wrong"]
    rows = []
    for task, t in res["tasks"].items():
        r = [TASK_TITLES.get(task, task), str(t["n"]), _f(t["edge_accuracy"], 2, True), _f(t["cut_share"], 2, True),
             _f(t["prompt_tokens_mean"], 0)]
        if "stand_in" in res:
            r.append(_f(t.get("stand_in_accuracy"), 2, True))
        rows.append(r + [_f(t["auroc"].get(k)) + (_ci(t["auroc_best_hold_ci"]) if k == rec["hold_signal"] else "")
                         for k in SHOWN_AUROC]
                    + [_f(t["kept_at_recommended"], 2, True), _f(t["wrong_kept_at_recommended"], 2, True)])
    all_row = ["**all**", str(ov["n"]), _f(ov["edge_accuracy"], 2, True), _f(ov["cut_share"], 2, True), ""]
    if "stand_in" in res:
        all_row.append(_f(res["stand_in"]["accuracy"], 2, True))
    rows.append(all_row + [""] * (len(SHOWN_AUROC) + 2))
    lines += _table(head, rows)

    lines += ["", "### Signals side by side (evaluation half)", "",
              f"Escalated requests count as answered right (the production cloud is a 70B model), so all-cloud "
              f"quality is 100 % and the edge alone is right on {_f(ov['evaluation_edge_accuracy'], 2, True)} of "
              "this half. Kept at 1 % / 5 % loss: the largest share of requests a threshold on the signal keeps "
              "on the edge while overall quality stays within 1 / 5 points of all-cloud (the best threshold for "
              "this half, so an upper bound; the thresholds chosen on the calibration half are scored below). "
              "APGR: mean performance gap recovered over escalation shares 0-100 % (random = 0.5). Designs: "
              "*hold* reads the whole edge answer (an answer cut at max_tokens always escalates); *first-k* "
              "decides on the first k tokens; *prompt* decides before the edge is asked.", ""]
    rows = []
    for r in res["signals"]:
        rows.append([r["signal"], r["design"], _f(r["auroc"]) + _ci(r["auroc_ci"]),
                     _f(r["auroc_without_cut_rule"]), _f(r["apgr"]),
                     _f(r["kept_at_1pct_loss"], 2, True) + _ci(r["kept_at_1pct_loss_ci"], pct=True),
                     _f(r["kept_at_5pct_loss"], 2, True) + _ci(r["kept_at_5pct_loss_ci"], pct=True)])
    lines += _table(["signal", "design", "AUROC (95 % CI)", "AUROC without the cut rule", "APGR",
                     "kept at 1 % loss (CI)", "kept at 5 % loss (CI)"], rows)
    c = rec["combined"]
    lines += ["", f"Combined (parameters chosen on the calibration half by APGR): {res['combination_summary']}; "
              f"calibration APGR {_f(c['calibration_apgr'])}."]

    lines += ["", "### Thresholds chosen on the calibration half, scored on the evaluation half", "",
              "Keep the edge answer when the signal is >= the threshold (log-probabilities in nats per token).", ""]
    rows = [[t["signal"], f"{t['loss_target']:.0%}", _f(t["threshold"], 3), _f(t["calibration_kept"], 2, True),
             _f(t["evaluation_kept"], 2, True), _f(t["evaluation_loss"], 3, True)] for t in res["thresholds"]]
    lines += _table(["signal", "loss target", "threshold", "kept (calibration)", "kept (evaluation)",
                     "loss (evaluation)"], rows)
    lines += ["", "Recommended defaults for a policy (from this run; `recommended` in the result file):", ""]
    for k, v in rec["thresholds"].items():
        lines.append(f"- `{k}`: " + ("none (no threshold keeps anything within this loss)" if v is None else f"{v:.3f}"))
    lines.append(f"- best hold signal on the calibration half: {rec['hold_signal']}; best first-k: k = {rec['first_k']}")

    tm = res["timing"]
    t_first_k = tm[f"time_to_{rec['first_k']}_tokens_p50_s"]
    lines += ["", "### Cost (evaluation half, at the 5 % thresholds above)", "",
              f"Edge node: peak RSS {res['edge']['peak_rss_mib']:.0f} MiB; mean edge CPU "
              f"{tm['edge_cpu_s_per_request_mean']:.3f} s per answered request (the node's own CPU time, /proc, "
              f"one request in flight). Edge time to first token p50 {tm['edge_ttft_p50_s'] * 1e3:.0f} ms, to "
              f"{rec['first_k']} tokens {t_first_k * 1e3:.0f} ms, to the whole "
              f"answer {tm['whole_answer_p50_s'] * 1e3:.0f} ms (p90 {tm['whole_answer_p90_s'] * 1e3:.0f} ms). "
              "Added latency of an escalated request = edge time spent before the cloud is asked: the whole "
              "answer for *hold*, the first k tokens for *first-k*, nothing for a skipped prompt. A kept request's "
              "time to first token is the same wait under *hold* (the tokens are held back until the decision) "
              "and the k-token wait under *first-k*. Times are wall-clock on the shared machine and stretch with its "
              "load (see Setup); the tokens generated before escalating (after the prompt's prefill) and the CPU "
              "seconds do not.", ""]
    rows = []
    for name, cst in res["cost"].items():
        rows.append([name, "—" if cst["threshold"] is None else _f(cst["threshold"], 3), _f(cst["kept"], 2, True), _f(cst["escalated_after_edge"], 2, True),
                     _f(cst["skipped_edge"], 2, True), _f(cst["edge_cpu_s_per_request"], 3),
                     _ms(cst["added_latency_escalated_p50_s"]), _ms(cst["added_latency_escalated_p90_s"]),
                     _f(cst["tokens_before_decision_escalated_mean"], 1)])
    lines += _table(["design", "threshold", "kept on edge", "escalated after an edge attempt", "edge skipped",
                     "edge CPU-s per request", "added latency p50", "added latency p90",
                     "tokens generated before escalating (mean)"], rows)
    fk = tm["first_k_attempts_measured"]
    if fk:
        parts = [f"k = {k}: {v['cpu_s_mean']:.3f} s CPU, {v['wall_s_mean'] * 1e3:.0f} ms (estimate from the full "
                 f"answers' timings: {v['estimated_cpu_s_mean']:.3f} s)" for k, v in fk.items()]
        lines += ["", "An escalated first-k attempt costs less CPU than a whole answer: its CPU is estimated from "
                  "the streamed timings (share of the answer's wall time, CPU ~ wall at one request in flight); "
                  f"measured directly with `max_tokens` = k on {next(iter(fk.values()))['n']} of the questions: "
                  + "; ".join(parts) + "."]
    if "stand_in" in res:
        si = res["stand_in"]
        kept = [r[f"kept_at_{p}pct_loss"] for r in si["signals"] for p in (1, 5)]
        span = _f(min(kept), 2, True) + ("" if min(kept) == max(kept) else "-" + _f(max(kept), 2, True))
        lines += ["", "### Second view: the cloud stand-in scored the same way", "",
                  f"The stand-in (vLLM, SmolLM2-135M-Instruct in float32 from the same GGUF) answered "
                  f"{_f(si['accuracy'], 2, True)} right ({_f(si['evaluation_accuracy'], 2, True)} on the evaluation "
                  f"half; per task in the first table) and agreed with the edge's right/wrong on "
                  f"{_f(si['agreement_with_edge'], 2, True)} of the questions: it is the edge model, not a stronger "
                  "one. Counting its answers instead of \"the cloud is right\", every signal keeps "
                  f"{span} of the evaluation half at 1 % and at 5 % "
                  "loss, because escalating to it gains nothing; APGR, which divides by the edge-to-cloud quality "
                  "gap, is not reported for a gap under 5 points. This view checks the plumbing, not the cascade: "
                  "the main view above is the one that models a real cloud."]
    lines += ["", "### What the numbers mean", ""] + [f"- {n}" for n in (*findings(res), *res.get("notes", []))]
    return "\n".join(lines) + "\n"


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x * 1e3:.0f} ms"


def findings(res: dict[str, Any]) -> list[str]:
    """What this run's numbers say, in sentences whose every number is read from the result."""
    rec, tasks, ov = res["recommended"], res["tasks"], res["overall"]
    best = rec["hold_signal"]
    sig = {r["signal"]: r for r in res["signals"]}
    partly = {t: v for t, v in tasks.items() if t != "mmlu" and v["auroc"][best] is not None}
    out = []
    if partly:
        lo, hi = min(v["auroc"][best] for v in partly.values()), max(v["auroc"][best] for v in partly.values())
        whole = sig[best]["auroc"]
        out.append(f"Where the edge model is partly competent (every task but MMLU) the {best} of its answer "
                   f"separates right from wrong answers with AUROC {lo:.2f}-{hi:.2f} within a task; over the "
                   f"whole mix (evaluation half) it is {whole:.2f}"
                   + (", lower than within any task: the tasks' confidence levels differ, and a confident wrong "
                      "answer on one task outranks an unsure right one on another." if whole < lo else ".")
                   + " A policy has one threshold for the whole mix.")
    if "mmlu" in tasks:
        m = tasks["mmlu"]
        ci = m["auroc_best_hold_ci"]
        shares = {k: v for k, v in (m.get("answer_letter_shares") or {}).items() if k in "ABCD"}
        top = max(shares, key=lambda k: shares[k], default=None)
        said = f", answering {top} to {shares[top] * 100:.0f} % of the questions" if top else ""
        out.append(f"MMLU, the control: the edge is right on {m['edge_accuracy'] * 100:.0f} % (four options: chance "
                   f"is 25 %){said}; its right answers are luck, and {best} reaches AUROC {m['auroc'][best]:.2f} (95 % CI {ci[0]:.2f}-{ci[1]:.2f}): "
                   + ("no signal" if ci[0] <= 0.5 else "a weak signal at most")
                   + ", as expected for answers that are guesses. Yet its letter answers are short "
                   f"and fluent, so at the {best} 5 % threshold {m['kept_at_recommended'] * 100:.0f} % of MMLU "
                   f"questions stay on the edge and {m['wrong_kept_at_recommended'] * 100:.0f} % are kept although "
                   "wrong: on traffic the edge cannot answer, confidence does not protect quality; a prompt rule "
                   "must send it to the cloud.")
    fk = [r for r in res["signals"] if r["design"] == "first-k"]
    if fk:
        b = max(fk, key=lambda r: r["auroc"])
        out.append(f"First-k signals are weak here (best: {b['signal']}, AUROC {b['auroc']:.2f} against "
                   f"{sig[best]['auroc']:.2f} for the whole answer): the first tokens of this model's answers "
                   "are mostly a preamble (\"The capital of ...\", \"To solve this ...\", see `items` in the "
                   "result file), the same for right and wrong answers.")
    cut = sig.get("finished (not cut)")
    if cut:
        out.append(f"{ov['cut_share'] * 100:.0f} % of the answers hit max_tokens ({res['settings']['max_tokens']}); "
                   f"they are wrong or unfinished, so the cut rule alone has AUROC {cut['auroc']:.2f}, and it lifts "
                   f"{best} from {sig[best]['auroc_without_cut_rule']:.2f} to {sig[best]['auroc']:.2f}.")
    easiest = max(tasks, key=lambda t: tasks[t]["kept_at_recommended"] or 0)
    e = tasks[easiest]
    out.append(f"The kept shares are small because the edge is right on only {ov['edge_accuracy'] * 100:.0f} % "
               "of this deliberately hard mix: a cascade can never keep much more than the edge gets right plus the "
               f"loss it is allowed. Where the edge does better the same threshold keeps more: of the "
               f"{TASK_TITLES.get(easiest, easiest)} questions ({e['edge_accuracy'] * 100:.0f} % answered right) it "
               f"keeps {e['kept_at_recommended'] * 100:.0f} % of them on the edge, and "
               f"{e['wrong_kept_at_recommended'] * 100:.0f} % of them are kept although wrong.")
    c = sig.get("combined")
    if c:
        cost = res["cost"]
        hold = next(v for k, v in cost.items() if k.startswith("hold"))
        comb = next(v for k, v in cost.items() if k.startswith("combined"))
        sk = rec["combined"]["evaluation_skipped"]
        text = (f"The combination ({res['combination_summary']}) keeps {c['kept_at_5pct_loss'] * 100:.0f} % at 5 % "
                f"loss against {sig[best]['kept_at_5pct_loss'] * 100:.0f} % for {best} alone, and costs "
                f"{comb['edge_cpu_s_per_request']:.3f} edge CPU-s per request against {hold['edge_cpu_s_per_request']:.3f}.")
        if sk["edge_accuracy"] is not None:
            text += (f" The prompts it skips ({sk['share'] * 100:.0f} % of the evaluation half) were answered right "
                     f"by the edge {sk['edge_accuracy'] * 100:.0f} % of the time at {sk['edge_cpu_s_mean']:.3f} CPU-s "
                     f"each (the others: {sk['others_edge_accuracy'] * 100:.0f} %, {sk['others_edge_cpu_s_mean']:.3f} s).")
        out.append(text)
    return out
