"""The policy store: hot reload from file changes, SIGHUP and reload(); a bad file never takes effect and
traffic keeps being decided; several processes watching one file converge on the same version."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tiergate.core.types import Features, Priority
from tiergate.policies.loader import PolicyError
from tiergate.policies.store import PolicyMetrics, PolicyStore, policy_version

from .conftest import BASE

GOOD2 = BASE.replace("min: 0.7", "min: 0.5")
BAD = BASE.replace("tier: cloud\n", "tier: nowhere\n", 1)


def feats(**kw) -> Features:
    return Features(**{**dict(prompt_tokens=10, priority=Priority.NORMAL, complexity=0.6, requested_model="auto",
                              tenant="t", text="x"), **kw})


async def _until(predicate, what: str, timeout_s: float = 20.0) -> None:
    """Wait for a condition, bounded; the bound is a hang guard, not a performance threshold."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def _value(reg: CollectorRegistry, name: str, labels: dict[str, str] | None = None) -> float | None:
    return reg.get_sample_value(name, labels or {})


def _reloads(reg: CollectorRegistry, result: str) -> float:
    return _value(reg, "tiergate_policy_reloads_total", {"result": result}) or 0.0


async def _armed(path: Path, text: str, noticed) -> None:
    """Until the file watch is armed: save the same text again and again until the store notices a save (its
    reload finds nothing changed). A watcher starts on its own thread; a change made before it is ready is lost."""
    for _ in range(400):
        path.write_text(text)
        for _ in range(4):
            if noticed():
                return
            await asyncio.sleep(0.05)
    raise AssertionError("the file watch never noticed a save")


@pytest.fixture
def reg() -> CollectorRegistry:
    return CollectorRegistry()


def test_invalid_file_at_start_is_fatal(write, reg):
    with pytest.raises(PolicyError, match="unknown tier 'nowhere'"):
        PolicyStore(write(BAD), metrics=PolicyMetrics(reg))


def test_current_exposes_policy_engine_version(write, reg):
    path = write(BASE)
    store = PolicyStore(path, metrics=PolicyMetrics(reg))
    cur = store.current
    assert cur.version == policy_version(BASE.encode()) and cur.source == path
    assert cur.engine.decide(feats(complexity=0.8)).rule == "complex" and cur.loaded_at > 0
    assert _value(reg, "tiergate_policy_info", {"version": cur.version, "source": str(path)}) == 1
    assert _value(reg, "tiergate_policy_rules") == 3


@pytest.mark.anyio
async def test_reload_results_and_metrics(write, reg):
    path = write(BASE)
    store = PolicyStore(path, metrics=PolicyMetrics(reg))
    first = store.current.version
    seen = []

    async def on_change(active):
        seen.append(active.version)

    store.on_change(on_change)

    r = await store.reload()
    assert (r.ok, r.changed, r.version) == (True, False, first)
    assert _value(reg, "tiergate_policy_reloads_total", {"result": "unchanged"}) == 1

    path.write_text(BAD)
    r = await store.reload()
    assert not r.ok and not r.changed and r.version == first and "unknown tier 'nowhere'" in r.error
    assert store.current.version == first and store.last_error == r.error
    assert _value(reg, "tiergate_policy_reloads_total", {"result": "invalid"}) == 1
    assert _value(reg, "tiergate_policy_last_reload_success") == 0

    path.write_text(GOOD2)
    r = await store.reload()
    assert r.ok and r.changed and r.version == policy_version(GOOD2.encode()) == store.current.version
    assert store.current.engine.decide(feats(complexity=0.6)).rule == "complex"  # the new threshold
    assert seen == [r.version] and store.last_error is None
    assert _value(reg, "tiergate_policy_reloads_total", {"result": "ok"}) == 1
    assert _value(reg, "tiergate_policy_last_reload_success") == 1
    assert _value(reg, "tiergate_policy_info", {"version": r.version, "source": str(path)}) == 1
    assert _value(reg, "tiergate_policy_info", {"version": first, "source": str(path)}) is None

    path.unlink()
    r = await store.reload()
    assert not r.ok and "cannot read" in r.error and store.current.version == policy_version(GOOD2.encode())
    assert _value(reg, "tiergate_policy_reloads_total", {"result": "unreadable"}) == 1


@pytest.mark.anyio
async def test_file_watch_rejects_bad_files_while_traffic_keeps_flowing(write, reg):
    """Live traffic decides continuously while the file goes bad, half-written, and good again."""
    path = write(BASE)
    store = PolicyStore(path, metrics=PolicyMetrics(reg))
    v1 = store.current.version
    decided = 0
    failures: list[BaseException] = []
    stop = asyncio.Event()

    async def traffic():
        nonlocal decided
        while not stop.is_set():
            try:
                d = store.current.engine.decide(feats(complexity=0.6))
                assert d.tier in ("edge", "cloud")
                decided += 1
            except BaseException as exc:  # noqa: BLE001 - any failure is the test's finding
                failures.append(exc)
            await asyncio.sleep(0)

    await store.start()
    runner = asyncio.get_running_loop().create_task(traffic())
    try:
        await _armed(path, BASE, lambda: _reloads(reg, "unchanged") > 0)
        path.write_text(BAD)
        await _until(lambda: _reloads(reg, "invalid") == 1, "the bad file to be rejected")
        assert store.current.version == v1
        path.write_text(BASE[: len(BASE) // 2])  # an editor's half-written save
        await _until(lambda: _reloads(reg, "invalid") == 2, "the half-written file to be rejected")
        assert store.current.version == v1
        path.write_text(GOOD2)
        await _until(lambda: store.current.version == policy_version(GOOD2.encode()), "the fix to be adopted")
    finally:
        stop.set()
        await runner
        await store.stop()
    assert not failures and decided > 0
    assert store.current.engine.decide(feats(complexity=0.6)).rule == "complex"


@pytest.mark.anyio
async def test_write_and_rename_is_seen(write, reg, tmp_path):
    path = write(BASE)
    store = PolicyStore(path, metrics=PolicyMetrics(reg))
    await store.start()
    try:
        await _armed(path, BASE, lambda: _reloads(reg, "unchanged") > 0)
        tmp = tmp_path / ".policy.yaml.swp"
        tmp.write_text(GOOD2)
        os.replace(tmp, path)  # how most editors and `kubectl cp` save
        await _until(lambda: store.current.version == policy_version(GOOD2.encode()), "the renamed file")
    finally:
        await store.stop()


@pytest.mark.anyio
async def test_sighup_reloads(write, reg):
    path = write(BASE)
    store = PolicyStore(path, metrics=PolicyMetrics(reg))
    previous = signal.getsignal(signal.SIGHUP)
    assert store.install_sighup()
    try:
        path.write_text(GOOD2)
        os.kill(os.getpid(), signal.SIGHUP)
        await _until(lambda: store.current.version == policy_version(GOOD2.encode()), "SIGHUP reload")
    finally:
        asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        signal.signal(signal.SIGHUP, previous)


WATCHER = textwrap.dedent("""
    import asyncio, sys
    from pathlib import Path
    from prometheus_client import CollectorRegistry
    from tiergate.policies.store import PolicyMetrics, PolicyStore

    async def main(path, stop):
        reg = CollectorRegistry()
        store = PolicyStore(path, metrics=PolicyMetrics(reg))
        await store.start()
        last, said = None, set()
        while not Path(stop).exists():
            v = store.current.version
            if v != last:
                print(v, flush=True)
                last = v
            for result in ("unchanged", "invalid"):  # a save noticed (the watch is armed); a bad file refused
                if result not in said and reg.get_sample_value("tiergate_policy_reloads_total", {"result": result}):
                    print("reload:" + result, flush=True)
                    said.add(result)
            await asyncio.sleep(0.05)
        await store.stop()

    asyncio.run(main(sys.argv[1], sys.argv[2]))
""")


@pytest.mark.anyio
async def test_processes_watching_one_file_converge(write, tmp_path):
    path = write(BASE)
    stop = tmp_path / "stop"
    script = tmp_path / "watcher.py"
    script.write_text(WATCHER)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    logs = [tmp_path / f"w{i}.log" for i in range(2)]
    procs = [subprocess.Popen([sys.executable, str(script), str(path), str(stop)], stdout=log.open("w"),
                              stderr=subprocess.DEVNULL, env=env) for log in logs]

    def versions(i: int) -> list[str]:  # the lines the watcher printed (structlog's lines are interleaved)
        return [w for w in logs[i].read_text().split() if re.fullmatch(r"[0-9a-f]{12}", w)]

    def said(i: int, what: str) -> bool:
        return what in logs[i].read_text().split()

    try:
        v1, v2 = policy_version(BASE.encode()), policy_version(GOOD2.encode())
        await _until(lambda: all(versions(i) == [v1] for i in range(2)), "both processes to start", 60)
        await _armed(path, BASE, lambda: all(said(i, "reload:unchanged") for i in range(2)))
        path.write_text(BAD)
        await _until(lambda: all(said(i, "reload:invalid") for i in range(2)), "both processes to refuse it", 30)
        path.write_text(GOOD2)
        await _until(lambda: all(versions(i)[-1:] == [v2] for i in range(2)), "both processes to converge", 30)
        assert all(versions(i) == [v1, v2] for i in range(2)), f"a process served the bad file: {[versions(i) for i in range(2)]} (v1={v1}, v2={v2})"
    finally:
        stop.write_text("")
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
