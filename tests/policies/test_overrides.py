"""policies/overrides: cache and timeout settings leave out what they inherit (None) and check the ranges of
what they set."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tiergate.policies.overrides import CacheOverride, TimeoutsOverride


def test_everything_left_out_is_inherited() -> None:
    assert all(v is None for v in CacheOverride().model_dump().values())
    assert all(v is None for v in TimeoutsOverride().model_dump().values())


@pytest.mark.parametrize("bad", [{"threshold": 1.1}, {"ttl_s": -1}, {"max_false_hit_rate": 0.0},
                                 {"max_false_hit_rate": 1.0}, {"verify_mode": "later"}, {"max_temperature": 3}])
def test_cache_settings_out_of_range_are_errors(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        CacheOverride.model_validate(bad)


def test_timeouts_are_positive_except_the_queue_wait() -> None:
    assert TimeoutsOverride(queue_s=0).queue_s == 0
    with pytest.raises(ValidationError):
        TimeoutsOverride(total_s=0)
