import pytest

from tiergate.core.wire import decode_chat
from tiergate.edge_node.engine.sampling import DEFAULT_MIN_P, DEFAULT_TOP_K, SamplingParams


def test_defaults_are_valid():
    assert SamplingParams().validate(100) is None


@pytest.mark.parametrize(
    ("params", "field"),
    [
        (SamplingParams(temperature=3.0), "temperature"),
        (SamplingParams(top_p=0.0), "top_p"),
        (SamplingParams(top_k=-1), "top_k"),
        (SamplingParams(min_p=1.5), "min_p"),
        (SamplingParams(max_tokens=0), "max_tokens"),
        (SamplingParams(stop=("a", "b", "c", "d", "e")), "stop"),
        (SamplingParams(presence_penalty=5), "presence_penalty"),
        (SamplingParams(repetition_penalty=0), "repetition_penalty"),
        (SamplingParams(logit_bias={100: 1.0}), "logit_bias"),
        (SamplingParams(logit_bias={0: 1e39}), "logit_bias"),  # +inf in float32: aborted llama.cpp's grammar
        (SamplingParams(logit_bias={1: -100.5}), "logit_bias"),
        (SamplingParams(logit_bias={2: float("nan")}), "logit_bias"),
        (SamplingParams(temperature=float("nan")), "temperature"),
        (SamplingParams(presence_penalty=float("inf")), "presence_penalty"),
        (SamplingParams(repetition_penalty=float("inf")), "repetition_penalty"),
    ],
)
def test_validation_names_the_field(params, field):
    msg = params.validate(100)
    assert msg is not None and msg.startswith(field), msg


def test_a_bias_at_the_edge_of_the_documented_range_is_accepted():
    assert SamplingParams(logit_bias={0: 100.0, 1: -100.0}).validate(100) is None


def test_requests_that_do_not_say_get_llama_cpp_defaults_and_may_turn_them_off():
    # optional dependency: edge_node.server.completions imports llama-cpp-python (the edge extra); the other tests
    # here need only edge_node.engine.sampling
    from tiergate.edge_node.server.completions import sampling_params as _params

    plain = decode_chat(b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.7}')
    p = _params(plain, 8, 1000)
    assert (p.top_k, p.min_p) == (DEFAULT_TOP_K, DEFAULT_MIN_P) == (40, 0.05)
    off = decode_chat(b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "top_k": 0, "min_p": 0}')
    p = _params(off, 8, 1000)
    assert (p.top_k, p.min_p) == (0, 0.0)
