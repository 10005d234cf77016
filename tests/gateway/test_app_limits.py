"""Limits, priorities, disconnects, edge registration and the service endpoints, end to end."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.gateway.conftest import stack
from tests.support.instant_upstream import GATE, make_app
from tests.support.registration import CLAIM
from tests.support.servers import aiohttp_server
from tests.support.waiting import eventually, wait_until
from tiergate.gateway.auth import KeyRing

CHAT = {"model": "auto", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "temperature": 1}


def _sample(gw, name: str, **labels: str) -> float:
    """A counter's value on the gateway's own registry (what its /metrics serves)."""
    return gw.registry.get_sample_value(name, labels) or 0.0


def test_rate_limit_answers_429_with_retry_after(tmp_path):
    keys = tmp_path / "keys.yaml"
    keys.write_text("tenants:\n  tiny: {requests_per_minute: 2}\nkeys:\n  - {tenant: tiny, key: tiny-key-123}\n")
    with stack(tmp_path, keyring=KeyRing.from_file(keys)) as s:
        url = s["gw"].url + "/v1/chat/completions"
        codes = [httpx.post(url, json=CHAT, headers={"Authorization": "Bearer tiny-key-123"}) for _ in range(3)]
        assert [r.status_code for r in codes] == [200, 200, 429]
        assert int(codes[2].headers["retry-after"]) >= 1
        assert codes[2].json()["error"]["type"] == "rate_limit_error"
        assert [r.headers["x-ratelimit-remaining-requests"] for r in codes] == ["1", "0", "0"]
        assert codes[0].headers["x-ratelimit-limit-requests"] == "2"


def test_twenty_concurrent_requests_cannot_overshoot_a_token_limit(tmp_path):
    """A tenant with 60 tokens a minute sends 20 requests at once, each needing its prompt and 8 tokens of answer:
    only as many are answered as fit in 60 (reserved before any backend sees them, and given back in part as each
    one settles what it really used), each answer says where the limits stand, and the rest are 429s that say when
    a retry would fit. Charged after the answer, as before, all 20 were answered."""
    keys = tmp_path / "keys.yaml"
    keys.write_text("tenants:\n  tiny: {tokens_per_minute: 60}\nkeys:\n  - {tenant: tiny, key: tiny-key-123}\n")
    with stack(tmp_path, keyring=KeyRing.from_file(keys), policy={"fallback": False}) as s:
        url = s["gw"].url + "/v1/chat/completions"

        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=30, headers={"Authorization": "Bearer tiny-key-123"}) as c:
                return await asyncio.gather(*(c.post(url, json={**CHAT, "max_tokens": 8}) for _ in range(20)))

        answers = asyncio.run(burst())
        ok = [r for r in answers if r.status_code == 200]
        refused = [r for r in answers if r.status_code != 200]
        charged = sum(r.json()["usage"]["total_tokens"] for r in ok)
        assert ok and len(refused) >= 10 and len(ok) + len(refused) == 20
        assert charged <= 60, [r.json()["usage"] for r in ok]
        assert all(int(r.headers["x-ratelimit-remaining-tokens"]) < 60 for r in ok)
        assert {r.status_code for r in refused} == {429}
        assert {r.json()["error"]["code"] for r in refused} == {"token_limit_exceeded"}
        assert all(1 <= int(r.headers["retry-after"]) <= 120 for r in refused)


def test_tenant_max_tokens_caps_the_upstream_request(tmp_path):
    keys = tmp_path / "keys.yaml"
    keys.write_text("tenants:\n  capped: {max_tokens: 2}\nkeys:\n  - {tenant: capped, key: capped-key-1}\n")
    with stack(tmp_path, keyring=KeyRing.from_file(keys)) as s:
        r = httpx.post(s["gw"].url + "/v1/chat/completions", json={**CHAT, "max_tokens": 50},
                       headers={"Authorization": "Bearer capped-key-1"})
        assert r.json()["choices"][0]["message"]["content"] == "w0 w1 "  # the backend was asked for 2


def test_client_disconnect_stops_the_upstream_stream(tmp_path):
    with stack(tmp_path, edge_modes=("slow",), chunks=200, policy={"fallback": False}) as s:
        gw = s["gw"].gateway
        disconnects = _sample(gw, "tiergate_client_disconnects_total", tier="edge")
        with httpx.stream("POST", s["gw"].url + "/v1/chat/completions", headers={"Authorization": "Bearer key-alpha-1"},
                          json={**CHAT, "stream": True, "max_tokens": 200}) as r:
            it = r.iter_lines()
            assert next(line for line in it if line.startswith("data: "))
        # The gateway closed its upstream connection: the slot and the in-flight count are free again.
        route = gw.tiers["edge"]
        wait_until(lambda: route.admission.inflight == 0 and all(e.inflight == 0 for e in route.pool.endpoints()),
                   what="upstream released after client disconnect")
        assert _sample(gw, "tiergate_client_disconnects_total", tier="edge") == disconnects + 1


def test_client_leaving_before_a_json_answer_frees_the_backend_and_every_slot(tmp_path):
    # The backend would take 10 s to answer; the client gives up after 0.5 s.
    with stack(tmp_path, edge_modes=("slow",), chunks=200, policy={"fallback": False}) as s:
        gw, url = s["gw"].gateway, s["gw"].url
        disconnects = _sample(gw, "tiergate_client_disconnects_total", tier="edge")
        gone = {"endpoint": "chat", "tier": "edge", "rule": "default", "cache": "bypass", "status": "499"}
        answered_499 = _sample(gw, "tiergate_requests_total", **gone)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/v1/chat/completions", headers={"Authorization": "Bearer key-alpha-1"},
                       json={**CHAT, "max_tokens": 200}, timeout=0.5)
        route = gw.tiers["edge"]
        wait_until(lambda: route.admission.inflight == 0 and all(e.inflight == 0 for e in route.pool.endpoints())
                   and gw.limiter._concurrent["alpha"] == 0, timeout_s=3, what="slots freed after the client left")
        assert _sample(gw, "tiergate_client_disconnects_total", tier="edge") == disconnects + 1
        assert _sample(gw, "tiergate_requests_total", **gone) == answered_499 + 1


def test_a_client_leaving_before_its_json_answer_is_charged_what_the_backend_was_asked_for(tmp_path):
    keys = tmp_path / "keys.yaml"
    keys.write_text("tenants:\n  metered: {tokens_per_minute: 100000}\n  other: {}\nkeys:\n"
                    "  - {tenant: metered, key: metered-key-1}\n  - {tenant: other, key: other-key-1}\n")
    with stack(tmp_path, keyring=KeyRing.from_file(keys), edge_modes=("slow",), chunks=60,
               policy={"fallback": False, "max_concurrency": 1, "queue_s": 30}) as s:
        gw, url = s["gw"].gateway, s["gw"].url + "/v1/chat/completions"
        admission = gw.tiers["edge"].admission

        metered = gw.keys.authenticate("Bearer metered-key-1")

        def charged() -> float:
            return asyncio.run(gw.limiter.tokens_used(metered)) or 0.0

        # The backend works for 3 s on a 60-token answer; the client leaves after 0.5 s, with nothing to show
        # for it: the prompt and the 60 tokens it asked for are charged (a JSON answer shows no progress).
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url, json={**CHAT, "max_tokens": 60}, headers={"Authorization": "Bearer metered-key-1"},
                       timeout=0.5)
        wait_until(lambda: charged() > 60, timeout_s=3, what="the abandoned answer charged")
        assert charged() <= 60 + 10  # and a prompt of a word or two
        wait_until(lambda: admission.inflight == 0, timeout_s=3, what="the slot freed")

        # A client leaving while queued behind another tenant's request cost no backend anything: not charged.
        before = charged()

        async def queued_then_gone() -> None:
            async with httpx.AsyncClient(timeout=30) as c:
                holder = asyncio.create_task(c.post(url, json={**CHAT, "max_tokens": 60},
                                                    headers={"Authorization": "Bearer other-key-1"}))
                await eventually(lambda: admission.inflight == 1, "the holder has the tier's one slot", timeout_s=2)
                with pytest.raises(httpx.ReadTimeout):
                    await c.post(url, json={**CHAT, "max_tokens": 60},
                                 headers={"Authorization": "Bearer metered-key-1"}, timeout=0.5)
                await eventually(lambda: admission.waiting == 0, "the leaver out of the queue", timeout_s=2)
                assert admission.inflight == 1  # it left the queue; the holder still runs
                holder.cancel()

        asyncio.run(queued_then_gone())
        wait_until(lambda: admission.inflight == 0, timeout_s=3, what="the holder's slot freed")
        assert charged() == before


def test_client_leaving_the_queue_gives_up_its_place(tmp_path):
    with stack(tmp_path, edge_modes=("hang",), policy={"fallback": False, "max_concurrency": 1, "queue_s": 30,
                                                        "first_byte_s": 30}) as s:
        gw, url = s["gw"].gateway, s["gw"].url + "/v1/chat/completions"
        admission = gw.tiers["edge"].admission

        async def main() -> None:
            async with httpx.AsyncClient(timeout=30) as c:
                holder = asyncio.create_task(c.post(url, json=CHAT, headers={"Authorization": "Bearer key-alpha-1"}))
                await eventually(lambda: admission.inflight == 1, "the holder has the tier's one slot", timeout_s=30)
                with pytest.raises(httpx.ReadTimeout):
                    await c.post(url, json=CHAT, headers={"Authorization": "Bearer key-gold-1"}, timeout=0.5)
                # long before its 30 s in the queue would have ended
                await eventually(lambda: admission.waiting == 0, "the leaver out of the queue", timeout_s=30)
                assert admission.inflight == 1  # the holder still has its slot
                holder.cancel()

        asyncio.run(main())
        wait_until(lambda: admission.inflight == 0, timeout_s=3, what="the holder's slot freed")




def test_saturated_tier_serves_high_priority_first_and_sheds_with_retry_after(tmp_path):
    # The backend holds every request until the test opens its gate, so the queue is built step by step, each
    # step waited for on the admission queue itself: first (normal) runs, low (beta) queues, high (gold)
    # queues after it. Once the gate opens, the slot goes to high before low, whatever the timing.
    with stack(tmp_path, edge_modes=("gated",), chunks=10,
               policy={"fallback": False, "max_concurrency": 1, "queue_s": 30.0}) as s:
        url, gate = s["gw"].url + "/v1/chat/completions", s["edges"][0].app[GATE]
        admission = s["gw"].gateway.tiers["edge"].admission
        done: list[str] = []

        async def one(client: httpx.AsyncClient, key: str, name: str) -> int:
            r = await client.post(url, json={**CHAT, "max_tokens": 10}, headers={"Authorization": f"Bearer {key}"})
            done.append(name)
            return r.status_code

        async def main() -> list[int]:
            async with httpx.AsyncClient(timeout=60) as c:
                first = asyncio.create_task(one(c, "key-alpha-1", "first"))
                await eventually(lambda: admission.inflight == 1, "first running", timeout_s=30)
                low = asyncio.create_task(one(c, "key-beta-1", "low"))
                await eventually(lambda: admission.waiting == 1, "low queued", timeout_s=30)
                high = asyncio.create_task(one(c, "key-gold-1", "high"))
                await eventually(lambda: admission.waiting == 2, "high queued behind low", timeout_s=30)
                gate.set()
                return list(await asyncio.gather(first, low, high))

        codes = asyncio.run(main())
        assert codes == [200, 200, 200]
        assert done == ["first", "high", "low"]  # high (gold) overtook low (beta), which had queued earlier

    with stack(tmp_path, edge_modes=("hang",), policy={"fallback": False, "max_concurrency": 1, "queue_s": 0.3,
                                                        "first_byte_s": 5}) as s:
        url = s["gw"].url + "/v1/chat/completions"
        admission = s["gw"].gateway.tiers["edge"].admission

        async def shed() -> httpx.Response:
            async with httpx.AsyncClient(timeout=30) as c:
                hold = asyncio.create_task(c.post(url, json=CHAT, headers={"Authorization": "Bearer key-alpha-1"}))
                await eventually(lambda: admission.inflight == 1, "the holder has the tier's one slot", timeout_s=30)
                r = await c.post(url, json=CHAT, headers={"Authorization": "Bearer key-alpha-1"})
                hold.cancel()
                return r

        r = asyncio.run(shed())
        assert r.status_code == 429 and r.json()["error"]["code"] == "tier_saturated"
        assert int(r.headers["retry-after"]) >= 1


def test_the_policys_queue_bound_sheds_at_once_beyond_max_waiting(tmp_path):
    """One request runs, `max_waiting` (2) wait, the rest are shed at once instead of waiting `queue_s`."""
    with stack(tmp_path, edge_modes=("gated",), chunks=10,
               policy={"fallback": False, "max_concurrency": 1, "queue_s": 20.0, "max_waiting": 2}) as s:
        url, gate = s["gw"].url + "/v1/chat/completions", s["edges"][0].app[GATE]
        admission = s["gw"].gateway.tiers["edge"].admission

        async def one(client: httpx.AsyncClient) -> tuple[int, str | None]:
            r = await client.post(url, json={**CHAT, "max_tokens": 10}, headers={"Authorization": "Bearer key-alpha-1"})
            return r.status_code, (r.json().get("error") or {}).get("code") if r.status_code != 200 else None

        async def main() -> list[tuple[int, str | None]]:
            async with httpx.AsyncClient(timeout=60) as c:
                held = [asyncio.create_task(one(c))]
                await eventually(lambda: admission.inflight == 1, "one running", timeout_s=30)
                held += [asyncio.create_task(one(c)) for _ in range(2)]
                await eventually(lambda: admission.waiting == 2, "two waiting", timeout_s=30)
                shed = await asyncio.gather(one(c), one(c))  # answered while the gate is still shut
                gate.set()
                return list(await asyncio.gather(*held)) + list(shed)

        results = asyncio.run(main())
        assert sorted(code for code, _ in results) == [200, 200, 200, 429, 429], results
        assert {err for code, err in results if code == 429} == {"tier_saturated"}




def test_priority_header_can_only_lower(tmp_path):
    with stack(tmp_path) as s:
        r = httpx.post(s["gw"].url + "/v1/chat/completions", json=CHAT,
                       headers={"Authorization": "Bearer key-alpha-1", "x-tiergate-priority": "sideways"})
        assert r.status_code == 400 and "x-tiergate-priority" in r.json()["error"]["message"]


def test_edge_nodes_register_by_heartbeat_and_get_traffic(tmp_path):
    with stack(tmp_path, edge_modes=()) as s:  # no static edge endpoints
        base = s["gw"].url
        assert httpx.post(base + "/v1/chat/completions", json={**CHAT, "model": "tiergate-edge"},
                          headers={"Authorization": "Bearer key-alpha-1"}).headers["x-tiergate-tier"] == "cloud"
        with aiohttp_server(make_app(4, "ok", model="edge-node-model")) as node:
            hb = {"node_id": "n1", "url": node.url, "model": "edge-node-model", "slots": 4, "busy": 0, "queued": 0}
            assert httpx.post(base + "/edge/v1/heartbeat", json=hb, headers=CLAIM).status_code == 200
            r = httpx.post(base + "/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer key-alpha-1"})
            assert r.headers["x-tiergate-tier"] == "edge" and r.json()["model"] == "edge-node-model"
            assert httpx.post(base + "/edge/v1/heartbeat", json={"node_id": ""}, headers=CLAIM).status_code == 400
            assert httpx.post(base + "/edge/v1/deregister", json={"node_id": "n1"}, headers=CLAIM).json()["known"]
            r = httpx.post(base + "/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer key-alpha-1"})
            assert r.headers["x-tiergate-tier"] == "cloud"


def test_edge_token_is_enforced_when_set(tmp_path):
    with stack(tmp_path, settings={"edge_token": "s3cret"}) as s:
        hb = {"node_id": "n1", "url": "http://127.0.0.1:1", "model": "m", "slots": 1}
        assert httpx.post(s["gw"].url + "/edge/v1/heartbeat", json=hb).status_code == 401
        ok = httpx.post(s["gw"].url + "/edge/v1/heartbeat", json=hb,
                        headers={"Authorization": "Bearer s3cret", **CLAIM})
        assert ok.status_code == 200


def test_health_ready_metrics_openapi(basic):
    base = basic["gw"].url
    assert httpx.get(base + "/healthz").json() == {"ok": True}
    ready = httpx.get(base + "/readyz").json()
    assert ready["ready"] is True and ready["tiers"] == {"edge": True, "cloud": True}
    httpx.post(base + "/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer key-alpha-1"})
    text = httpx.get(base + "/metrics").text
    assert 'tiergate_routing_decisions_total{rule="default",tier="edge"}' in text
    doc = httpx.get(base + "/openapi.json").json()
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models"} <= set(doc["paths"])
    assert "messages" in doc["components"]["schemas"]["ChatRequest"]["properties"]



def test_admin_reload_and_cache_invalidation(tmp_path):
    with stack(tmp_path, settings={"admin_key": "adm-key-1"}) as s:
        base = s["gw"].url
        assert httpx.post(base + "/admin/policy/reload").status_code == 401
        adm = {"Authorization": "Bearer adm-key-1"}
        r = httpx.post(base + "/admin/policy/reload", headers=adm)
        assert r.status_code == 200 and r.json()["ok"] is True
        good = s["policy"].read_text()
        s["policy"].write_text(good.replace("tier: edge", "tier: nowhere"))
        r = httpx.post(base + "/admin/policy/reload", headers=adm)
        assert r.status_code == 422 and "nowhere" in r.json()["error"]["message"]
        assert r.json()["error"]["code"] == "policy_invalid" and r.json()["ok"] is False
        chat = {**CHAT, "temperature": 0}
        assert httpx.post(base + "/v1/chat/completions", json=chat,
                          headers={"Authorization": "Bearer key-alpha-1"}).status_code == 200  # last good policy
        r = httpx.post(base + "/v1/chat/completions", json=chat, headers={"Authorization": "Bearer key-alpha-1"})
        assert r.headers["x-tiergate-cache"] == "hit-exact"
        r = httpx.post(base + "/admin/cache/invalidate?all=true&tenant=", headers=adm)
        assert r.status_code == 400 and r.json()["error"]["param"] == "tenant"  # not "the tenant named ''"
        r = httpx.post(base + "/admin/cache/invalidate?tenant=alpha", headers=adm)
        assert r.status_code == 200 and r.json()["removed"] >= 1
        r = httpx.post(base + "/v1/chat/completions", json=chat, headers={"Authorization": "Bearer key-alpha-1"})
        assert r.headers["x-tiergate-cache"] == "miss"


def test_cloud_routing_comes_from_the_policy_and_a_reload_rebuilds_the_pool(tmp_path):
    with stack(tmp_path, settings={"admin_key": "adm-key-1"}) as s:
        gw, adm = s["gw"], {"Authorization": "Bearer adm-key-1"}
        before = gw.gateway.tiers["cloud"].pool
        assert (before.strategy, before.selector.bound, before.model) == ("prefix", 1.2, "cloud-model")
        text = s["policy"].read_text().replace(
            "    served_model: cloud-model\n",
            "    served_model: cloud-model\n    routing: {strategy: least_load, load_bound: 1.5, max_num_seqs: 16}\n")
        s["policy"].write_text(text)
        assert httpx.post(gw.url + "/admin/policy/reload", headers=adm).json()["ok"] is True
        after = gw.gateway.tiers["cloud"].pool
        assert after is not before and gw.gateway.tiers["edge"].pool is not None
        assert (after.strategy, after.selector.bound, [e.slots for e in after.endpoints()]) == ("least_load", 1.5, [16])
        r = httpx.post(gw.url + "/v1/chat/completions", json={**CHAT, "model": "tiergate-cloud"},
                       headers={"Authorization": "Bearer key-alpha-1"})
        assert r.status_code == 200 and r.headers["x-tiergate-tier"] == "cloud"
