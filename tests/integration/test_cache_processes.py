"""Two OS processes sharing one Redis cache (Redis 7 and Redis 8): what one stores, the other hits (exact and
semantic)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest

from tests.cache.helpers import RULE, SETTINGS, chat, fresh_metrics
from tests.support.waiting import eventually
from tiergate.cache import build_cache

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

_CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from tiergate.cache import build_cache
    from tests.cache.helpers import RULE, SETTINGS, answer, chat

    async def main(url, embedder):
        cache = build_cache(url, embedder, settings=SETTINGS)
        await cache.start()
        ok = await cache.store(chat("How do I invest my money wisely?"), "acme", RULE, answer("From the child."))
        await cache.stop()
        print("stored" if ok else "not stored")

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


async def test_an_entry_stored_by_another_process_is_hit_here(redis_url, embedder_dir, onnx_embedder) -> None:
    metrics, _ = fresh_metrics()
    here = build_cache(redis_url, None, embedder=onnx_embedder, metrics=metrics, settings=SETTINGS)
    await here.start()
    try:
        child = await asyncio.to_thread(  # the child's stream events are read by this loop meanwhile
            subprocess.run, [sys.executable, "-c", _CHILD, redis_url, str(embedder_dir)], capture_output=True,
            text=True, timeout=120, check=False)
        assert child.returncode == 0 and child.stdout.strip().splitlines()[-1] == "stored", child.stderr[-2000:]
        exact = await here.check(chat("How do I invest my money wisely?"), "acme", RULE)
        assert exact.status == "hit-exact" and exact.hit.answer.text == "From the child."
        # Redis 8: VSIM finds it at once; Redis 7: once this process's index has followed the stream.
        await eventually(lambda: _status(here, "How can I invest my money wisely?", "hit-semantic"),
                         "a semantic hit on the child's entry")
        para = await here.check(chat("How can I invest my money wisely?"), "acme", RULE)
        assert para.hit.answer.text == "From the child."
        assert (await here.check(chat("How can I invest my money wisely?"), "other", RULE)).status == "miss"
    finally:
        await here.stop()


async def _status(cache, text: str, status: str) -> bool:
    return (await cache.check(chat(text), "acme", RULE)).status == status
