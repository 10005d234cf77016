"""Distillation capture: only tenants that opted in are recorded, redacted before anything is written, within the
caps and the TTL, in Redis or a local file; the export writes a chat-format training set and its manifest."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import time
from pathlib import Path

import httpx
import pytest
import redis as redis_sync
from typer.testing import CliRunner

from tests.support.instant_upstream import make_app
from tests.support.servers import aiohttp_server, gateway_server
from tests.support.waiting import wait_until
from tiergate.cache.redis.conn import open_redis
from tiergate.gateway.auth import KeyRing
from tiergate.gateway.distill import STREAM_KEY, JsonlRecords, Redactor, RedisRecords
from tiergate.gateway.distill_cli import distill_app
from tiergate.gateway.settings import Settings
from tiergate.policies.distill_config import DistillConfig

KEYS = KeyRing.from_inline("key-acme-1=acme:normal,key-beta-1=beta:normal")
SECRET = "my card is 4111-1111-1111-1111"


def _policy(path: Path, edge: str, cloud: str, distill: str) -> Path:
    path.write_text(f"""
version: 1
defaults: {{cache: {{enabled: false}}, timeouts: {{connect_s: 1, total_s: 30}}}}
tiers:
  edge: {{kind: edge, model: tiergate-edge, endpoints: ["{edge}"]}}
  cloud: {{kind: cloud, model: tiergate-cloud, stand_in: true, endpoints: ["{cloud}"]}}
rules:
  - name: complex
    when: {{keywords: {{any: [prove]}}}}
    tier: cloud
  - name: default
    tier: edge
    fallbacks: [cloud]
distill: {distill}
""")
    return path


def _ask(url: str, key: str, text: str, stream: bool = False) -> httpx.Response:
    r = httpx.post(url + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=30, json={
        "model": "auto", "messages": [{"role": "user", "content": text}], "max_tokens": 4, "stream": stream})
    assert r.status_code == 200, r.text
    return r


def test_only_opted_in_tenants_are_recorded_redacted_and_exported(tmp_path):
    records = tmp_path / "distill.jsonl"
    with aiohttp_server(make_app(chunks=4, model="cloud-model")) as cloud:
        # The edge is down: the default rule's requests fall back to the cloud, which is what gets recorded.
        policy = _policy(tmp_path / "p.yaml", "http://127.0.0.1:9", cloud.url,
                         "{tenants: [acme], rules: [complex], redact: {patterns: ['\\d{4}-\\d{4}-\\d{4}-\\d{4}']}}")
        settings = Settings(policy=policy, embedder=None, redis_url=None, distill_file=records)
        with gateway_server(settings, keyring=KEYS, ready=False) as gw:
            _ask(gw.url, "key-acme-1", f"hello, {SECRET}")
            _ask(gw.url, "key-acme-1", "prove it", stream=True)  # the `complex` rule, a stream
            _ask(gw.url, "key-beta-1", f"hello, {SECRET}")  # beta did not opt in
            wait_until(lambda: (gw.gateway.registry.get_sample_value("tiergate_distill_records_total",
                                                                     {"result": "recorded"}) or 0) == 2,
                       what="two records")
    lines = [json.loads(x) for x in records.read_text().splitlines()]
    assert [r["tenant"] for r in lines] == ["acme", "acme"] and {r["rule"] for r in lines} == {"default", "complex"}
    assert "4111" not in records.read_text() and "[REDACTED]" in lines[0]["messages"][0]["content"]
    assert lines[0]["answer"].startswith("w0 w1") and lines[0]["tier"] == "cloud"
    assert lines[0]["decision"] == ["edge", "cloud"]

    out = tmp_path / "train.jsonl"
    runner = CliRunner()
    r = runner.invoke(distill_app, ["export", "--out", str(out), "--file", str(records)])
    assert r.exit_code == 0, r.output
    examples = [json.loads(x) for x in out.read_text().splitlines()]
    assert examples[0]["messages"][-1] == {"role": "assistant", "content": lines[0]["answer"]}
    manifest = json.loads((tmp_path / "train.jsonl.manifest.json").read_text())
    assert manifest["examples_written"] == 2 and manifest["by_tenant"] == {"acme": 2}
    again = runner.invoke(distill_app, ["export", "--out", str(out), "--file", str(records)])
    assert again.exit_code == 2 and "--force" in again.output  # no silent overwrite
    assert runner.invoke(distill_app, ["export", "--out", str(out), "--file", str(records), "--force",
                                       "--tenant", "nobody"]).exit_code == 0
    assert out.read_text() == ""


@pytest.fixture
def umask_022():
    """The usual umask, under which a plain open() makes files world-readable (0644)."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_every_file_of_prompts_and_answers_is_private_to_its_owner(tmp_path, umask_022):
    """A real gateway's records file, its compaction and the export (training set and manifest) are mode 0600,
    and a records file an older version left 0644 is narrowed when the gateway next writes to it."""
    records = tmp_path / "distill.jsonl"
    records.write_bytes(b"")
    records.chmod(0o644)  # as a gateway before this fix left it
    with aiohttp_server(make_app(chunks=4, model="cloud-model")) as cloud:
        policy = _policy(tmp_path / "p.yaml", "http://127.0.0.1:9", cloud.url, "{tenants: [acme]}")
        settings = Settings(policy=policy, embedder=None, redis_url=None, distill_file=records)
        with gateway_server(settings, keyring=KEYS, ready=False) as gw:
            _ask(gw.url, "key-acme-1", "hello")
            wait_until(lambda: (gw.gateway.registry.get_sample_value("tiergate_distill_records_total",
                                                                     {"result": "recorded"}) or 0) == 1,
                       what="one record")
    assert records.read_text().count("\n") == 1 and _mode(records) == 0o600
    out = tmp_path / "train.jsonl"
    assert CliRunner().invoke(distill_app, ["export", "--out", str(out), "--file", str(records)]).exit_code == 0
    assert _mode(out) == 0o600 and _mode(tmp_path / "train.jsonl.manifest.json") == 0o600
    fresh = JsonlRecords(tmp_path / "new" / "d.jsonl")
    cfg = DistillConfig(tenants=["acme"], max_records=2, ttl_s=3600)

    async def fill() -> None:
        for i in range(20):  # past the cap: compacted through a temporary file
            await fresh.add({"ts": time.time(), "i": i, "answer": "x"}, cfg)

    asyncio.run(fill())
    assert len(asyncio.run(fresh.all())) < 20 and _mode(fresh.path) == 0o600


def test_without_a_distill_section_nothing_is_recorded(tmp_path):
    records = tmp_path / "distill.jsonl"
    with aiohttp_server(make_app(chunks=4, model="cloud-model")) as cloud:
        policy = _policy(tmp_path / "p.yaml", "http://127.0.0.1:9", cloud.url, "null")
        with gateway_server(Settings(policy=policy, embedder=None, redis_url=None, distill_file=records),
                            keyring=KEYS, ready=False) as gw:
            _ask(gw.url, "key-acme-1", "hello")
            wait_until(lambda: (gw.gateway.registry.get_sample_value("tiergate_requests_total", {
                "endpoint": "chat", "tier": "cloud", "rule": "default", "cache": "bypass", "status": "200"}) or 0) == 1,
                what="the request accounted")
    assert not records.exists()


def test_the_local_file_keeps_to_its_cap_and_ttl(tmp_path):
    cfg = DistillConfig(tenants=["acme"], max_records=10, ttl_s=3600)
    store = JsonlRecords(tmp_path / "d.jsonl")
    old = time.time() - 7200

    async def fill() -> None:
        for i in range(5):
            await store.add({"ts": old, "i": i, "answer": "x"}, cfg)  # expired
        for i in range(30):
            await store.add({"ts": time.time(), "i": i, "answer": "x"}, cfg)

    asyncio.run(fill())
    kept = asyncio.run(store.all())
    assert len(kept) <= 21 and all(r["ts"] > old for r in kept)  # compacted: at most 10% (+10) past the cap
    assert kept[-1]["i"] == 29


def test_the_redis_stream_is_capped_and_trimmed_by_age(redis_url):
    cfg = DistillConfig(tenants=["acme"], max_records=100, ttl_s=60)
    client = redis_sync.Redis.from_url(redis_url)
    client.delete(STREAM_KEY)
    client.xadd(STREAM_KEY, {"r": b"{}"}, id=f"{int((time.time() - 3600) * 1000)}-0")  # an hour old

    async def fill() -> None:
        redis = open_redis(redis_url)
        try:
            store = RedisRecords(redis)
            for i in range(300):
                await store.add({"i": i, "answer": "x"}, cfg)
        finally:
            await redis.aclose()

    asyncio.run(fill())
    entries = client.xrange(STREAM_KEY)
    assert len(entries) < 300 and json.loads(entries[-1][1][b"r"])["i"] == 299  # the cap (approximate) held
    assert all(int(eid.split(b"-")[0]) >= (time.time() - 120) * 1000 for eid, _ in entries)  # the old one went
    client.delete(STREAM_KEY)


def test_redaction_runs_patterns_then_the_hook():
    r = Redactor([r"\d{3}-\d{4}"], "tests.gateway.test_distill:_shout")
    assert r("call 555-1234 now") == "CALL [REDACTED] NOW"
    with pytest.raises(ImportError):
        Redactor([], "no_such_module:fn")


def _shout(text: str) -> str:
    return text.upper().replace("[REDACTED]".upper(), "[REDACTED]")
