"""Confidence signals from token log-probabilities."""

from __future__ import annotations

import math

import pytest

from tiergate.core.types import Cascade
from tiergate.policies.confidence import (
    TokenScore,
    confidence,
    scores_from_openai,
    scores_from_text_logprobs,
    verdict,
)


def test_signals_over_the_whole_answer_and_its_first_tokens():
    scores = [TokenScore(-0.1, -3.0), TokenScore(-2.0, -2.5), TokenScore(-0.5, None)]
    c = confidence(scores)
    assert c.tokens == 3 and c.mean_logprob == pytest.approx(-2.6 / 3) and c.min_logprob == -2.0
    assert c.mean_margin == pytest.approx((2.9 + 0.5) / 2)  # only where the runner-up is known
    first = confidence(scores, first_k=1)
    assert (first.tokens, first.mean_logprob, first.min_logprob, first.mean_margin) == (1, -0.1, -0.1, pytest.approx(2.9))


def test_an_empty_answer_shows_no_confidence():
    c = confidence([])
    assert c.tokens == 0 and c.mean_logprob == -math.inf and c.min_logprob == -math.inf and c.mean_margin is None


def test_openai_shapes_are_read():
    chat = [{"token": "Rome", "logprob": -0.3, "top_logprobs": [{"token": "Rome", "logprob": -0.3},
                                                                {"token": "Milan", "logprob": -2.0}]},
            {"token": ".", "logprob": -1.5, "top_logprobs": [{"token": ",", "logprob": -0.9},
                                                             {"token": ".", "logprob": -1.5}]}]
    assert scores_from_openai(chat) == [TokenScore(-0.3, -2.0), TokenScore(-1.5, -0.9)]  # sampled below the top
    text = {"tokens": ["a", "b"], "token_logprobs": [-0.2, -1.0], "top_logprobs": [{"a": -0.2, "c": -4.0}, {"b": -1.0}]}
    assert scores_from_text_logprobs(text) == [TokenScore(-0.2, -4.0), TokenScore(-1.0, None)]


def test_the_verdict_follows_the_thresholds_and_the_answers_end():
    sure = [TokenScore(-0.1, -4.0)] * 5
    shaky = [TokenScore(-0.1, -4.0)] * 4 + [TokenScore(-3.0, -0.5)]
    c = Cascade("cloud", min_mean_logprob=-0.5)
    assert verdict(c, sure, "stop", "Paris").keep
    assert verdict(c, shaky, "stop", "Paris").reason == "low_mean_logprob"
    assert verdict(Cascade("cloud", min_mean_logprob=-0.5, first_tokens=4), shaky, None, "Par").keep  # judged early
    assert verdict(Cascade("cloud", min_token_logprob=-2.0), shaky, "stop", "x").reason == "low_token_logprob"
    assert verdict(Cascade("cloud", min_margin=1.0), shaky, "stop", "x").keep  # mean margin (4*3.9 - 2.5)/5 > 1
    assert verdict(c, sure, "length", "Paris").reason == "length"
    assert verdict(c, [], "stop", "").reason == "empty"
    assert verdict(Cascade("cloud", min_mean_logprob=-0.5, escalate_on_length=False), sure, "length", "P").keep
