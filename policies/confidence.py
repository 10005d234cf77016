"""How sure a model was of its answer, from its token log-probabilities: the signals a confidence cascade reads.

An answer's tokens each carry the log-probability the model gave them and, with `top_logprobs >= 2`, the runner-up's.
From those: the mean and the minimum log-probability over the answer (or over its first k tokens, which a streaming
cascade has long before the answer ends) and the mean top-1/top-2 margin. Published cascades (FrugalGPT, AutoMix,
vLLM Semantic Router's "confidence") use the same family; bench/cascade measures which one separates right from
wrong answers of the edge model (AUROC) on tasks with checkable gold answers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tiergate.core.types import Cascade

__all__ = ["Confidence", "TokenScore", "CascadeVerdict", "confidence", "judge_recorded", "verdict", "scores_from_openai", "scores_from_text_logprobs"]


@dataclass(frozen=True, slots=True)
class TokenScore:
    """One generated token: its log-probability and the best alternative's (None when not reported)."""

    logprob: float
    runner_up: float | None = None


@dataclass(frozen=True, slots=True)
class Confidence:
    tokens: int  # how many tokens the signals are over
    mean_logprob: float
    min_logprob: float
    mean_margin: float | None  # mean of (chosen - best other) log-probability, where the runner-up is known

    def as_dict(self) -> dict[str, float | int | None]:
        return {"tokens": self.tokens, "mean_logprob": round(self.mean_logprob, 4),
                "min_logprob": round(self.min_logprob, 4),
                "mean_margin": None if self.mean_margin is None else round(self.mean_margin, 4)}


def confidence(scores: Sequence[TokenScore], first_k: int | None = None) -> Confidence:
    """The signals over the answer's tokens (the first `first_k` of them, when given). An empty answer has no
    evidence of confidence: mean and minimum are -inf."""
    used = list(scores[:first_k] if first_k else scores)
    if not used:
        return Confidence(0, -math.inf, -math.inf, None)
    lps = [s.logprob for s in used]
    margins = [s.logprob - s.runner_up for s in used if s.runner_up is not None]
    return Confidence(len(used), sum(lps) / len(lps), min(lps), sum(margins) / len(margins) if margins else None)


def scores_from_openai(entries: Sequence[dict[str, Any]]) -> list[TokenScore]:
    """TokenScores from OpenAI chat `logprobs.content` entries (the runner-up is the best `top_logprobs` entry that
    is not the chosen token)."""
    out = []
    for e in entries:
        chosen = e.get("token")
        others = [t["logprob"] for t in e.get("top_logprobs") or () if t.get("token") != chosen]
        out.append(TokenScore(float(e["logprob"]), max(others) if others else None))
    return out


def scores_from_text_logprobs(logprobs: dict[str, Any]) -> list[TokenScore]:
    """TokenScores from a text completion's `logprobs` (`tokens`, `token_logprobs`, `top_logprobs` maps)."""
    out = []
    for token, lp, top in zip(logprobs.get("tokens") or (), logprobs.get("token_logprobs") or (),
                              logprobs.get("top_logprobs") or (), strict=False):
        others = [v for k, v in (top or {}).items() if k != token]
        out.append(TokenScore(float(lp), max(others) if others else None))
    return out


@dataclass(frozen=True, slots=True)
class CascadeVerdict:
    keep: bool
    reason: str  # "confident", or why it escalates: low_mean_logprob, low_token_logprob, low_margin, length, empty
    confidence: Confidence


def verdict(cascade: Cascade, scores: Sequence[TokenScore], finish_reason: str | None, text: str) -> CascadeVerdict:
    """Keep the first tier's answer, or escalate, as the cascade's thresholds say."""
    early = cascade.first_tokens is not None and finish_reason is None  # a stream judged on its start
    return _judge(cascade, confidence(scores, cascade.first_tokens), finish_reason, text, early)


def judge_recorded(cascade: Cascade, record: dict[str, Any]) -> CascadeVerdict:
    """A cascade's verdict from signals recorded in a traffic log (what `policy simulate` replays):
    {"mean_logprob", "min_logprob", "mean_margin", "tokens", "finish_reason", "text"} as bench/cascade writes
    them. A missing signal is not checked; a missing text is not empty."""
    conf = Confidence(int(record.get("tokens", 1)), float(record.get("mean_logprob", 0.0)),
                      float(record.get("min_logprob", 0.0)),
                      None if record.get("mean_margin") is None else float(record["mean_margin"]))
    return _judge(cascade, conf, record.get("finish_reason"), str(record.get("text", "x")), False)


def _judge(cascade: Cascade, conf: Confidence, finish_reason: str | None, text: str, early: bool) -> CascadeVerdict:
    if cascade.escalate_on_empty and not early and not text.strip():
        return CascadeVerdict(False, "empty", conf)
    if cascade.escalate_on_length and finish_reason == "length":
        return CascadeVerdict(False, "length", conf)
    if cascade.min_mean_logprob is not None and conf.mean_logprob < cascade.min_mean_logprob:
        return CascadeVerdict(False, "low_mean_logprob", conf)
    if cascade.min_token_logprob is not None and conf.min_logprob < cascade.min_token_logprob:
        return CascadeVerdict(False, "low_token_logprob", conf)
    if cascade.min_margin is not None and (conf.mean_margin is None or conf.mean_margin < cascade.min_margin):
        return CascadeVerdict(False, "low_margin", conf)
    return CascadeVerdict(True, "confident", conf)
