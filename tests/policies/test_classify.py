"""Classification features: priority lowering, tokenizer choice per target tier, complexity source."""

from __future__ import annotations

import concurrent.futures
import json
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from tiergate.complexity.model import DEFAULT_MODEL_FILE, ComplexityModel
from tiergate.complexity.tokens import TokenCounter
from tiergate.core.errors import OpenAIError
from tiergate.core.types import Priority
from tiergate.core.wire import ChatRequest, CompletionRequest
from tiergate.policies.classify import PRIORITY_HEADER, Classifier, lowered_priority, messages_of
from tiergate.policies.loader import load_policy

POLICY = """\
version: 1
tiers:
  edge: {kind: edge, model: tiergate-edge, tokenizer: bpe.json}
  cloud: {kind: cloud, model: tiergate-cloud, endpoints: ["http://127.0.0.1:1"]}
rules:
  - name: all
    tier: edge
"""


@dataclass
class _Active:
    policy: object


class _Store:
    def __init__(self, policy):
        self.current = _Active(policy)


def _bpe(path: Path) -> None:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["hello"] * 5, trainers.BpeTrainer(
        vocab_size=280, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.save(str(path))


@pytest.fixture
def clf(tmp_path) -> Classifier:
    _bpe(tmp_path / "bpe.json")
    (tmp_path / "policy.yaml").write_text(POLICY)
    return Classifier(_Store(load_policy(tmp_path / "policy.yaml")))


def chat(text: str, model: str = "auto", **kw) -> ChatRequest:
    return msgspec.convert({"model": model, "messages": [{"role": "user", "content": text}], **kw}, ChatRequest)


@pytest.mark.parametrize("tenant,header,expected", [
    (Priority.HIGH, None, Priority.HIGH),
    (Priority.HIGH, "low", Priority.LOW),
    (Priority.HIGH, "NORMAL", Priority.NORMAL),
    (Priority.LOW, "critical", Priority.LOW),  # never raised above the tenant's tier
    (Priority.NORMAL, "2", Priority.NORMAL),
    (Priority.CRITICAL, "0", Priority.LOW),
])
def test_priority_is_lowered_never_raised(clf, tenant, header, expected):
    headers = {PRIORITY_HEADER: header} if header is not None else {}
    assert clf.features(chat("hi"), "t", tenant, headers).priority == expected
    assert lowered_priority(tenant, header) == expected


def test_bad_priority_header_is_a_400(clf):
    with pytest.raises(OpenAIError) as info:
        clf.features(chat("hi"), "t", Priority.HIGH, {"X-Tiergate-Priority": "urgent"})
    assert info.value.status == 400 and "unknown priority" in str(info.value.message)


def test_tokens_are_counted_with_the_target_tiers_tokenizer(clf, tmp_path):
    text = "Tokenization differs between model families."
    bpe = TokenCounter(str(tmp_path / "bpe.json"))
    wordpiece = TokenCounter()
    assert bpe.count_text(text) != wordpiece.count_text(text)
    overhead = 4 + 3
    # `auto` goes where the catch-all rule sends it: the edge tier, with its BPE tokenizer
    assert clf.features(chat(text), "t", Priority.NORMAL, {}).prompt_tokens == bpe.count_text(text) + overhead
    # naming the cloud model: the cloud tier has no tokenizer configured -> the documented default
    f = clf.features(chat(text, model="tiergate-cloud"), "t", Priority.NORMAL, {})
    assert f.prompt_tokens == wordpiece.count_text(text) + overhead
    assert clf.count_tokens(chat(text), "cloud") == wordpiece.count_text(text) + overhead


def test_features_carry_the_request(clf):
    req = chat("Statement 1 | x. Statement 2 | y.\nA. True, True\nB. False, False", stream=True, max_tokens=7,
               temperature=0.2)
    f = clf.features(req, "acme", Priority.NORMAL, {"X-Custom": "v"})
    assert f.tenant == "acme" and f.stream is True and f.max_tokens == 7 and f.temperature == 0.2
    assert f.text == req.prompt_text() and f.headers["x-custom"] == "v"
    assert f.complexity == ComplexityModel.load_default().score(messages_of(req))
    comp = msgspec.convert({"model": "auto", "prompt": "hello"}, CompletionRequest)
    assert clf.features(comp, "t", Priority.NORMAL, {}).requested_model == "auto"


def test_policy_can_name_its_own_complexity_model(tmp_path):
    _bpe(tmp_path / "bpe.json")
    d = json.loads(DEFAULT_MODEL_FILE.read_text())
    d["calibration"] = {"raw": [-1e9, 1e9], "score": [0.25, 0.25]}  # a model that always says 0.25
    (tmp_path / "flat.json").write_text(json.dumps(d))
    (tmp_path / "policy.yaml").write_text("complexity_model: flat.json\n" + POLICY)
    clf = Classifier(_Store(load_policy(tmp_path / "policy.yaml")))
    assert clf.features(chat("anything"), "t", Priority.NORMAL, {}).complexity == 0.25


def test_safe_to_call_from_worker_threads(clf):
    texts = [f"question {i}: " + "why " * (i % 40) for i in range(64)]
    expected = [clf.features(chat(t), "t", Priority.NORMAL, {}) for t in texts]
    fresh = Classifier(clf._store)  # lazily builds counters/models under concurrency
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda t: fresh.features(chat(t), "t", Priority.NORMAL, {}), texts))
    assert [(g.prompt_tokens, g.complexity) for g in got] == [(e.prompt_tokens, e.complexity) for e in expected]


_AWKWARD = ["", "plain words", "naïve café, 日本語 and tokenization!", "tabs\tand\r\nCRLF lines\n\n", "\x00\x07ctl",
            "x" * 150 + " over-long word", "emoji 🙂 and ZWJ 👩‍💻", "Statement 1 | A. True, False\nB. Wrong"]


def _messages(i: int) -> list[dict]:
    n = 1 + i % 3
    msgs = [{"role": "system", "content": _AWKWARD[(i + k) % len(_AWKWARD)]} for k in range(n)]
    msgs.append({"role": "user", "content": [{"type": "text", "text": _AWKWARD[i % len(_AWKWARD)]},
                                             {"type": "text", "text": f"part {i}"}]})
    return msgs


def test_one_wordpiece_pass_gives_the_same_features_as_two(clf, monkeypatch):
    """With the built-in tokenizer the token count and the complexity share one encode: same numbers."""
    reqs = [msgspec.convert({"model": "tiergate-cloud", "messages": _messages(i)}, ChatRequest) for i in range(40)]
    reqs += [msgspec.convert({"model": "tiergate-cloud", "prompt": p}, CompletionRequest) for p in _AWKWARD]
    counter = clf.counter_for(clf._store.current.policy, "tiergate-cloud")
    model = clf.complexity_model(clf._store.current.policy)
    assert counter.builtin and model.featurizer.encoder.builtin
    expected = [(counter.count(r), model.score(messages_of(r))) for r in reqs]
    monkeypatch.setattr(type(counter), "count", lambda *_: pytest.fail("counted with a second encode"))
    got = [clf.features(r, "t", Priority.NORMAL, {}) for r in reqs]
    assert [(f.prompt_tokens, f.complexity) for f in got] == expected


def test_a_prompt_longer_than_the_analysed_prefix_is_still_counted_in_full(clf):
    text = "word " * 5000  # 25,000 characters: complexity reads the first MAX_CHARS, the count reads all
    f = clf.features(chat(text, model="tiergate-cloud"), "t", Priority.NORMAL, {})
    assert f.prompt_tokens == 5000 + 4 + 3
    assert f.complexity == ComplexityModel.load_default().score(text)


def test_the_whole_conversation_is_classified(clf):
    """Earlier turns and the system prompt count as tokens; what is asked for comes from the last user turn."""
    ask = "Write a Python function that parses a CSV file with quoted fields; do not use the csv module."
    alone = clf.features(chat(ask, model="tiergate-cloud"), "t", Priority.NORMAL, {})
    msgs = [{"role": "system", "content": "You are a terse assistant. " * 30},
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": ask}]
    f = clf.features(msgspec.convert({"model": "tiergate-cloud", "messages": msgs}, ChatRequest), "t",
                     Priority.NORMAL, {})
    assert f.prompt_tokens > alone.prompt_tokens + 150
    # a familiar kind of request: the head is trusted, and it reads the last user message only
    assert f.complexity == alone.complexity
    later = [*msgs, {"role": "assistant", "content": "def parse(s): ..."}, {"role": "user", "content": "thanks!"}]
    g = clf.features(msgspec.convert({"model": "tiergate-cloud", "messages": later}, ChatRequest), "t",
                     Priority.NORMAL, {})
    assert g.complexity != f.complexity and g.prompt_tokens > f.prompt_tokens
