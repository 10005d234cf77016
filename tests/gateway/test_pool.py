"""Endpoint load: our own in-flight count is always current; a backend's reading adds only what is not ours."""

from __future__ import annotations

import pytest

from gateway.pool import Endpoint


def ep(slots: int = 8) -> Endpoint:
    return Endpoint(id="a", base_url="http://a", model="m", tier="cloud", slots=slots)


def test_load_follows_our_requests_between_readings() -> None:
    e = ep()
    e.inflight = 4
    e.set_reported_load(4 / 8)  # the backend sees exactly our four
    assert e.load() == pytest.approx(0.5)
    e.inflight = 0  # they finished right after the reading: the server is idle, not half busy
    assert e.load() == pytest.approx(0.0)
    e.inflight = 2
    assert e.load() == pytest.approx(2 / 8)


def test_other_replicas_requests_in_the_reading_are_kept() -> None:
    e = ep()
    e.inflight = 4
    e.set_reported_load(7 / 8)  # three more than ours: another gateway's, or queued ones
    e.inflight = 1
    assert e.load() == pytest.approx(4 / 8)
    e.set_reported_load(1.0)  # a full KV cache reads as fully busy whatever we have open
    assert e.load() == pytest.approx(1.0)


def test_requests_not_yet_seen_by_the_backend_still_count() -> None:
    e = ep()
    e.inflight = 5
    e.set_reported_load(2 / 8)  # three of ours have not reached the server yet
    assert e.load() == pytest.approx(5 / 8)
    fresh = ep()
    fresh.reported_load = 0.25  # built with a reading (an edge node's registration), nothing of ours open
    assert fresh.load() == pytest.approx(0.25)


def test_a_poller_names_how_many_of_ours_the_reading_could_hold() -> None:
    e = ep()
    e.inflight = 0  # our four finished between the scrape and the answer being parsed
    e.set_reported_load(4 / 8, ours=4)
    assert e.load() == pytest.approx(0.0)
    e.set_reported_load(6 / 8, ours=4)  # two were someone else's
    assert e.load() == pytest.approx(2 / 8)
