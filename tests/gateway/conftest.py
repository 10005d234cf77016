"""Gateway test fixtures: real uvicorn gateways in front of instant in-process backends."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from tests.support.instant_upstream import make_app
from tests.support.servers import aiohttp_server, gateway_server
from tiergate.gateway.auth import KeyRing
from tiergate.gateway.settings import Settings

KEYS = KeyRing.from_inline("key-alpha-1=alpha:normal,key-beta-1=beta:low,key-gold-1=gold:high")


def write_policy(path: Path, edge: list[str], cloud: list[str], *, fallback: bool = True,
                 max_concurrency: int | None = None, queue_s: float = 5.0, first_byte_s: float = 10.0,
                 between_chunks_s: float = 10.0, cache: bool = True, max_waiting: int | None = None,
                 total_s: float = 30.0) -> Path:
    """A small policy: everything goes to the edge (falling back to the cloud); model `tiergate-cloud` to the cloud."""
    mc = f"\n    max_concurrency: {max_concurrency}" if max_concurrency else ""
    if max_waiting is not None:
        mc += f"\n    queue: {{max_waiting: {max_waiting}}}"
    path.write_text(f"""\
version: 1
defaults:
  timeouts: {{connect_s: 1.0, first_byte_s: {first_byte_s}, between_chunks_s: {between_chunks_s}, total_s: {total_s}, queue_s: {queue_s}}}
  cache: {{enabled: {str(cache).lower()}, semantic: false}}
tiers:
  edge:
    kind: edge
    model: tiergate-edge
    endpoints: {edge!r}{mc}
  cloud:
    kind: cloud
    model: tiergate-cloud
    served_model: cloud-model
    endpoints: {cloud!r}
rules:
  - name: explicit-cloud
    when: {{model: [tiergate-cloud]}}
    tier: cloud
  - name: default
    tier: edge
    fallbacks: {['cloud'] if fallback else []!r}
""".replace("'", '"'))
    return path


@contextmanager
def stack(tmp_path: Path, *, edge_modes=("ok",), cloud_modes=("ok",), settings: dict | None = None,
          policy: dict | None = None, keyring: KeyRing = KEYS, chunks: int = 8) -> Iterator[dict]:
    """Backends (one instant server per mode), a policy pointing at them, and a gateway in front."""
    with ExitStack() as es:
        edges = [es.enter_context(aiohttp_server(make_app(chunks, m, model="edge-model"))) for m in edge_modes]
        clouds = [es.enter_context(aiohttp_server(make_app(chunks, m, model="cloud-model"))) for m in cloud_modes]
        pol = write_policy(tmp_path / "policy.yaml", [e.url for e in edges], [c.url for c in clouds],
                           **(policy or {}))
        s = Settings(**({"policy": pol, "embedder": None, "redis_url": None} | (settings or {})))
        gw = es.enter_context(gateway_server(s, keyring=keyring))
        yield {"gw": gw, "edges": edges, "clouds": clouds, "policy": pol}


@pytest.fixture
def basic(tmp_path) -> Iterator[dict]:
    with stack(tmp_path) as s:
        yield s


def write_cascade_policy(path: Path, edge: str, cloud: str, *, min_token_logprob: float = -0.0001) -> Path:
    """A cascade rule: the edge answers first (asked for log-probabilities), the cloud stand-in when unsure."""
    path.write_text(f"""
version: 1
defaults:
  cache: {{enabled: false}}
  timeouts: {{connect_s: 1, first_byte_s: 10, between_chunks_s: 10, total_s: 30, queue_s: 5}}
tiers:
  edge: {{kind: edge, model: tiergate-edge, endpoints: ["{edge}"]}}
  cloud: {{kind: cloud, model: tiergate-cloud, stand_in: true, endpoints: ["{cloud}"]}}
rules:
  - name: cascade
    tier: edge
    fallbacks: [cloud]
    cascade: {{min_token_logprob: {min_token_logprob}}}
""")
    return path
