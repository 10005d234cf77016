import pytest

from edge_node.sampling import SamplingParams


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
    ],
)
def test_validation_names_the_field(params, field):
    msg = params.validate(100)
    assert msg is not None and msg.startswith(field), msg
