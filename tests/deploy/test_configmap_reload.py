"""The policy hot-reloads when Kubernetes updates its ConfigMap volume.

The kubelet never rewrites a ConfigMap file in place: it writes the new content into a fresh hidden
directory and swaps the `..data` symlink to it (`policy.yaml -> ..data/policy.yaml` stays put). This test
lays out a directory exactly that way and drives the real PolicyStore through updates, a bad update (kept
out, the last good policy keeps serving) and a fix.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from itertools import count
from pathlib import Path

import pytest

from tiergate.policies.store import PolicyStore, policy_version

POLICY = """\
version: 1
tiers:
  edge: {{kind: edge, model: tiergate-edge}}
  cloud: {{kind: cloud, model: tiergate-cloud, endpoints: ["http://127.0.0.1:9"]}}
rules:
  - name: {rule}
    tier: {tier}
"""


class ConfigMapVolume:
    """What the kubelet's atomic writer does on a ConfigMap volume (pkg/volume/util/atomic_writer.go)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._serial = count()
        self.root.mkdir()
        self._current: Path | None = None

    def publish(self, text: str) -> None:
        new = self.root / f"..2026_11_22_01_00_00.{next(self._serial):09d}"
        new.mkdir()
        (new / "policy.yaml").write_text(text)
        tmp = self.root / "..data_tmp"
        os.symlink(new.name, tmp)
        os.replace(tmp, self.root / "..data")  # the atomic swap
        link = self.root / "policy.yaml"
        if not link.is_symlink():
            os.symlink("..data/policy.yaml", link)
        if self._current is not None:
            shutil.rmtree(self._current)
        self._current = new


async def _until(predicate, what: str, timeout_s: float = 20.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.05)
    assert predicate(), what


async def _watching(volume: ConfigMapVolume, store: PolicyStore, text: str) -> None:
    """The file watch starts in the background: publish probes (comment-only changes) until one is seen."""
    for attempt in range(10):
        probe = f"{text}# probe {attempt}\n"
        volume.publish(probe)
        try:
            await _until(lambda p=probe: store.current.version == policy_version(p.encode()), "probe", timeout_s=2)
            return
        except TimeoutError:
            continue
    raise AssertionError("the policy store never noticed a ConfigMap update")


@pytest.mark.anyio
async def test_policy_follows_configmap_symlink_swaps(tmp_path: Path):
    volume = ConfigMapVolume(tmp_path / "policy")
    first = POLICY.format(rule="to-edge", tier="edge")
    volume.publish(first)
    store = PolicyStore(volume.root / "policy.yaml")
    assert store.current.version == policy_version(first.encode())
    await store.start()
    try:
        await _watching(volume, store, first)
        second = POLICY.format(rule="to-cloud", tier="cloud")
        volume.publish(second)
        await _until(lambda: store.current.version == policy_version(second.encode()), "the update to be adopted")
        assert [r.name for r in store.current.policy.rules] == ["to-cloud"]

        volume.publish(POLICY.format(rule="to-nowhere", tier="nowhere"))  # an unknown tier: must not take effect
        await _until(lambda: store.last_error is not None, "the bad update to be rejected")
        assert store.current.version == policy_version(second.encode())
        assert "nowhere" in store.last_error

        third = POLICY.format(rule="fixed", tier="edge")
        volume.publish(third)
        await _until(lambda: store.current.version == policy_version(third.encode()), "the fix to be adopted")
        assert store.last_error is None
    finally:
        await store.stop()
