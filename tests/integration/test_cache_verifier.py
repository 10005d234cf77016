"""The cross-encoder verifier for real: `tiergate cache train-verifier` fine-tunes MiniLM (torch, the export
extra) on labelled pairs, `seed-bound --verifier` counts them in a real Redis 8, and a gateway process loads the
ONNX members and asks them about each semantic candidate of an error-bounded rule."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.support.instant_upstream import make_app
from tests.support.redis import flushed
from tests.support.servers import aiohttp_server, gateway_server
from tests.support.waiting import wait_until
from tiergate.cache.errbound import FLOOR
from tiergate.cache.keys import normalize_text
from tiergate.cache.pairscore import MANIFEST, PairScorer
from tiergate.cache.training.verifier import OUT_OF_FOLD, pair_key
from tiergate.gateway.auth import KeyRing
from tiergate.gateway.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

TIERGATE = str(Path(sys.executable).parent / "tiergate")
ACTIONS = ["learn python quickly", "save money for a house", "lose weight without dieting", "improve my english",
           "start a small business", "prepare for a job interview", "get better sleep", "write a good resume",
           "learn to play guitar", "stop procrastinating", "make friends in a new city", "train for a marathon",
           "invest in index funds", "cook rice properly", "fix a slow laptop", "learn machine learning",
           "speak in public with confidence", "grow tomatoes at home", "pay off credit card debt",
           "become a better writer"]
Q, PARA = "How do I invest in index funds?", "How can I invest in index funds?"
POLICY = """\
version: 1
defaults:
  timeouts: {{connect_s: 1.0, first_byte_s: 10, between_chunks_s: 10, total_s: 30, queue_s: 5}}
  cache: {{enabled: true, semantic: true, threshold: 0.94, ttl_s: 3600, max_temperature: 0.3,
          max_false_hit_rate: 0.1, verify_rate: 0.0}}
tiers:
  edge:
    kind: edge
    model: tiergate-edge
    endpoints: ["{edge}"]
    served_model: edge-model
rules:
  - name: default
    tier: edge
"""


def labelled_pairs() -> list[dict[str, object]]:
    """Paraphrases (duplicate) and questions about the same thing that ask something else (not): every pair
    shares its content words, so the guards let both kinds through to the verifier."""
    out: list[dict[str, object]] = []
    for act in ACTIONS:
        out += [{"a": f"How do I {act}?", "b": f"How can I {act}?", "duplicate": True},
                {"a": f"What is the best way to {act}?", "b": f"How should I {act}?", "duplicate": True},
                {"a": f"How do I {act}?", "b": f"Why do people {act}?", "duplicate": False},
                {"a": f"How do I {act}?", "b": f"Is it hard to {act}?", "duplicate": False}]
    return out


@pytest.fixture(scope="module")
def verifier(tmp_path_factory: pytest.TempPathFactory, embedder_dir: Path) -> tuple[Path, Path, dict]:
    tmp = tmp_path_factory.mktemp("verifier")
    pairs = tmp / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(p) + "\n" for p in labelled_pairs()))
    out = tmp / "verifier"
    done = subprocess.run([TIERGATE, "cache", "train-verifier", str(pairs), "--out", str(out),
                           "--embedder", str(embedder_dir)], capture_output=True, text=True, timeout=540,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "member 2 of 2: exporting to ONNX" in done.stderr  # the steps are shown as they run
    return out, pairs, json.loads(done.stdout)


def test_train_verifier_writes_members_the_gateway_can_load_and_each_pairs_out_of_fold_score(verifier):
    out, _, result = verifier
    pairs = labelled_pairs()
    assert result["ok"] and result["pairs"] == len(pairs) and 0 < result["judged"] <= len(pairs)
    meta = json.loads((out / MANIFEST).read_text())
    assert meta["members"] == ["member-0.onnx", "member-1.onnx"] and meta["fit_on_judged_pairs"] == result["judged"]
    oof = json.loads((out / OUT_OF_FOLD).read_text())
    assert len(oof) == result["judged"]  # one out-of-fold logit per pair the cache would judge
    scorer = PairScorer.load(out)
    try:
        texts = [(normalize_text(str(p["a"])), normalize_text(str(p["b"]))) for p in pairs]
        known = [t for t in texts if pair_key(*t) in oof]
        assert len(known) == result["judged"]
        logits = scorer.logits(known)
        assert np.isfinite(logits).all()
        # a pair's logit does not depend on the pairs scored with it (int8 would quantise over a batch)
        assert logits.tolist() == [scorer.logits([t])[0] for t in known]
        # the gateway's score is both members' mean: not the out-of-fold one (a single member, unseen pair)
        assert not np.allclose(logits, [oof[pair_key(*t)] for t in known], atol=1e-4)
        scores = scorer.bound_scores(np.full(len(known), 0.95), known)
        assert ((scores >= FLOOR) & (scores < 1.0)).all()
    finally:
        scorer.close()


def test_seed_bound_with_the_verifier_counts_the_pairs_in_redis_8(verifier, redis8_server, embedder_dir):
    out, pairs, result = verifier
    url = flushed(redis8_server)
    seeded = subprocess.run([TIERGATE, "cache", "seed-bound", str(pairs), "--tenant", "acme", "--redis", url,
                             "--embedder", str(embedder_dir), "--verifier", str(out)],
                            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert seeded.returncode == 0, seeded.stderr
    got = json.loads(seeded.stdout)
    assert got["ok"] and got["pairs"] == len(labelled_pairs()) and got["seeded"] == result["judged"]
    missing = subprocess.run([TIERGATE, "cache", "seed-bound", str(pairs), "--tenant", "acme", "--redis", url,
                              "--embedder", str(embedder_dir), "--verifier", str(out.parent / "absent")],
                             capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert missing.returncode == 2 and "train-verifier" in missing.stderr  # a clear error, no traceback
    assert "Traceback" not in missing.stderr


def test_a_gateway_with_the_verifier_asks_it_about_bounded_semantic_candidates(verifier, redis8_server,
                                                                              embedder_dir, tmp_path: Path):
    out, _, _ = verifier
    url = flushed(redis8_server)
    keys = KeyRing.from_inline("acme-key-123=acme:normal")
    with aiohttp_server(make_app(4, "ok", model="edge-model")) as edge:
        (tmp_path / "policy.yaml").write_text(POLICY.format(edge=edge.url))
        settings = Settings(policy=tmp_path / "policy.yaml", embedder=embedder_dir, redis_url=url,
                            cache_verifier=out)
        with gateway_server(settings, keyring=keys) as gw:
            def ask(text: str) -> httpx.Response:
                return httpx.post(gw.url + "/v1/chat/completions", timeout=30,
                                  headers={"authorization": "Bearer acme-key-123"},
                                  json={"model": "auto", "messages": [{"role": "user", "content": text}],
                                        "max_tokens": 6, "temperature": 0})

            def scored() -> float:
                return gw.gateway.registry.get_sample_value("tiergate_cache_verifier_seconds_count") or 0.0

            assert ask(Q).headers["x-tiergate-cache"] == "miss"
            wait_until(lambda: ask(Q).headers["x-tiergate-cache"] == "hit-exact", what="the answer to be stored")
            assert scored() == 0  # exact hits never need it
            para = ask(PARA)
            assert para.status_code == 200  # no evidence yet: a miss the tier answers, whatever the verifier says
            assert para.headers["x-tiergate-cache"] == "miss"
            assert scored() == 1  # the one semantic candidate of the bounded rule was scored by the members
            shown = httpx.get(gw.url + "/readyz", timeout=5).json()["cache"]["verifier"]
            assert shown["path"] == str(out) and shown["members"] == 2 and shown["axis"].startswith("v")
