"""`gateway.lifecycle`: the Gateway's start-up and shutdown bracket its life: the tiers follow the policy, the
cache built at start-up is what every collaborator reads, readiness follows the tiers and draining, and the keys
come from the file, else the inline keys, else the demo key if allowed, else none."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tests.gateway.conftest import write_policy
from tests.support.instant_upstream import make_app
from tests.support.servers import aiohttp_server
from tiergate.core.errors import OpenAIError
from tiergate.gateway.auth import DEMO_KEY, KeyRing
from tiergate.gateway.lifecycle import Gateway
from tiergate.gateway.settings import Settings

DEAD = "http://127.0.0.1:9"  # nothing listens there
BASE = {"api_keys_file": None, "api_keys": None, "embedder": None, "redis_url": None}


@pytest.fixture(autouse=True)
def _gc_restored() -> Iterator[None]:
    """Start-up tunes the garbage collector for the process; a test must leave it as it found it."""
    threshold = gc.get_threshold()
    yield
    gc.set_threshold(*threshold)
    gc.unfreeze()


def _gateway(policy: Path, **settings: object) -> Gateway:
    return Gateway(Settings(**(BASE | {"policy": policy} | settings)), keyring=KeyRing.from_inline("k=alpha"),
                   registry=CollectorRegistry())


def test_startup_builds_the_tiers_and_the_shared_cache_and_shutdown_drains_and_stops(tmp_path: Path) -> None:
    with aiohttp_server(make_app(4)) as edge, aiohttp_server(make_app(4)) as cloud:
        policy = write_policy(tmp_path / "p.yaml", [edge.url], [cloud.url])
        gw = _gateway(policy)

        async def run() -> tuple[object, ...]:
            before = (gw.cache, dict(gw.tiers), gw.settlements.cache())
            await gw.startup()
            started = (gw.cache, sorted(gw.tiers), gw.settlements.cache(), gw.ready(), gc.get_threshold())
            await gw.shutdown()
            return before, started, gw.ready()

        before, started, after = asyncio.run(run())
    assert before == (None, {}, None)  # nothing built before start-up
    cache, tiers, seen, (ready, detail), threshold = started
    assert cache is not None and seen is cache  # collaborators read the one cache start-up built
    assert tiers == ["cloud", "edge"] and ready and detail["draining"] is False
    assert detail["tiers"]["edge"] is True and set(detail["tiers"]) == {"cloud", "edge"} and detail["policy"]
    assert threshold == (20_000, 20, 20)  # the young generation is collected far less often
    assert after[0] is False and after[1]["draining"] is True  # shutting down: no longer ready


def test_a_gateway_without_a_cache_has_none_and_is_not_ready_without_a_healthy_tier(tmp_path: Path) -> None:
    policy = write_policy(tmp_path / "p.yaml", [DEAD], [DEAD])
    gw = _gateway(policy, cache=False)

    async def run() -> tuple[object, ...]:
        await gw.startup()
        try:
            return gw.cache, gw.settlements.cache(), gw.ready()
        finally:
            await gw.shutdown()

    cache, seen, (ready, detail) = asyncio.run(run())
    assert cache is None and seen is None and not ready and not any(detail["tiers"].values())


def test_its_registry_has_the_process_collectors_a_scrape_expects(tmp_path: Path) -> None:
    gw = Gateway(Settings(**(BASE | {"policy": write_policy(tmp_path / "p.yaml", [DEAD], [DEAD])})))
    names = {m.name for m in gw.registry.collect()}
    assert {"process_cpu_seconds", "python_info", "python_gc_objects_collected"} <= names
    assert any(n.startswith("tiergate_") for n in names)


@pytest.mark.parametrize(("settings", "accepts", "refuses"), [
    ({"api_keys": "inline-1=alpha"}, "inline-1", DEMO_KEY),
    ({"api_keys": "inline-1=alpha", "api_keys_file": "FILE"}, "file-key-1", "inline-1"),  # the file wins
    ({}, DEMO_KEY, "inline-1"),  # nothing configured: the documented demo key
    ({"demo_key": False}, None, DEMO_KEY),  # nothing configured and no demo key: every request is refused
], ids=["inline", "file", "demo", "none"])
def test_the_keys_come_from_the_file_else_inline_else_the_demo_key_if_allowed(
        tmp_path: Path, settings: dict[str, object], accepts: str | None, refuses: str) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("tenants:\n  acme: {priority: normal}\nkeys:\n  - {tenant: acme, key: file-key-1}\n")
    settings = {k: keys if v == "FILE" else v for k, v in settings.items()}
    policy = write_policy(tmp_path / "p.yaml", [DEAD], [DEAD])
    ring = Gateway(Settings(**(BASE | {"policy": policy} | settings)), registry=CollectorRegistry()).keys.ring
    if accepts is not None:
        ring.authenticate(f"Bearer {accepts}")
    with pytest.raises(OpenAIError) as refused:
        ring.authenticate(f"Bearer {refuses}")
    assert refused.value.status == 401
