"""`gateway.params.check_params`: the value rules the gateway applies before any backend sees a request."""

from __future__ import annotations

import msgspec
import pytest

from tiergate.core.errors import OpenAIError
from tiergate.core.wire import decode_chat
from tiergate.gateway.params import check_params

POISON = {"model": "auto", "messages": [{"role": "user", "content": "give json"}], "max_tokens": 8,
          "temperature": 0, "response_format": {"type": "json_object"}, "logit_bias": {"0": 1e39, "1": 1e39}}


def _check(body: dict) -> OpenAIError | None:
    try:
        check_params(decode_chat(msgspec.json.encode(body)), ["tiergate-edge"])
    except OpenAIError as e:
        return e
    return None


def test_a_logit_bias_that_is_infinite_in_float32_is_refused_before_any_backend():
    err = _check(POISON)
    assert err is not None and err.status == 400 and err.param == "logit_bias" and "-100 to 100" in str(err)


@pytest.mark.parametrize("field, value", [
    ("logit_bias", {"0": 100.5}), ("logit_bias", {"0": -1e300}), ("logit_bias", {"-3": 1}),
    ("logit_bias", {"abc": 1}), ("logit_bias", {"١٢": 1}),  # Arabic-Indic digits: str.isdigit, but no token id
    ("temperature", 1e308), ("temperature", -0.1), ("top_p", 0), ("top_p", 1.5),
    ("presence_penalty", 2.5), ("frequency_penalty", -1e39), ("min_p", 1.5), ("repetition_penalty", 0),
    ("repetition_penalty", 1e39), ("top_k", -2),
])
def test_each_out_of_range_number_is_a_400_naming_its_field(field, value):
    err = _check(POISON | {"logit_bias": {}, field: value})
    assert err is not None and err.status == 400 and err.param == field, err


@pytest.mark.parametrize("field, value", [
    ("logit_bias", {"0": 100, "1": -100, "50256": 0.5}), ("temperature", 2), ("temperature", 0), ("top_p", 1),
    ("presence_penalty", -2), ("frequency_penalty", 2), ("min_p", 0), ("repetition_penalty", 1.1), ("top_k", -1),
])
def test_values_at_the_edges_of_their_ranges_pass(field, value):
    assert _check(POISON | {"logit_bias": {}, field: value}) is None
