"""Helpers for policy tests: a small valid policy to start from, and files written into tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

BASE = """\
version: 1
defaults:
  cache: {enabled: true, threshold: 0.9, ttl_s: 600}
  timeouts: {connect_s: 1, queue_s: 2}
  max_tokens: 1000
tiers:
  edge:
    kind: edge
    model: tiergate-edge
    tokenizer: builtin:default
    fallbacks: [cloud]
  cloud:
    kind: cloud
    model: tiergate-cloud
    endpoints: ["http://127.0.0.1:8090"]
    timeouts: {first_byte_s: 30}
rules:
  - name: long
    when: {prompt_tokens: {min: 2000}}
    tier: cloud
  - name: complex
    when: {complexity: {min: 0.7}}
    tier: cloud
    fallbacks: [edge]
  - name: default
    tier: edge
"""


@pytest.fixture
def write(tmp_path: Path):
    """write(text, name='policy.yaml') -> Path"""

    def _write(text: str, name: str = "policy.yaml") -> Path:
        p = tmp_path / name
        p.write_text(text)
        return p

    return _write
