"""`gateway.pipeline.CompletionPipeline`: one request, one policy version, from its check to its settlement.

Most of the pipeline is exercised through the whole app (tests/gateway/test_app.py, test_app_limits.py); this file
holds what is about the pipeline's own contract."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from pathlib import Path

import httpx

from tests.gateway.conftest import write_cascade_policy
from tests.support.instant_upstream import GATE, HITS, OPENED, make_app
from tests.support.servers import aiohttp_server, gateway_server
from tests.support.waiting import wait_until
from tiergate.gateway import tiers as tiers_module
from tiergate.gateway.auth import KeyRing
from tiergate.gateway.settings import Settings
from tiergate.policies.loader import DEFAULT_POLICY

KEYS = KeyRing.from_inline("key-acme-1=acme:normal")


def _policy(path: Path, cloud: str, rule: str, distill: str) -> None:
    path.write_text(f"""
version: 1
defaults: {{cache: {{enabled: false}}, timeouts: {{connect_s: 1, first_byte_s: 60, total_s: 60}}}}
tiers:
  cloud: {{kind: cloud, model: tiergate-cloud, stand_in: true, endpoints: ["{cloud}"]}}
rules:
  - name: {rule}
    tier: cloud
distill: {distill}
""")


def test_a_reload_mid_request_leaves_the_request_under_the_version_it_began_with(tmp_path):
    """The backend holds the request while the policy file changes to a version with another rule name and no
    capture; once the new version is active the backend answers. The request is still answered, accounted and
    captured for distillation under the version it was decided under, and the next request under the new one."""
    records, policy = tmp_path / "distill.jsonl", tmp_path / "p.yaml"
    with aiohttp_server(make_app(chunks=4, mode="role_gated", model="cloud-model")) as cloud:
        _policy(policy, cloud.url, "first", "{tenants: [acme], rules: [first]}")
        settings = Settings(policy=policy, embedder=None, redis_url=None, distill_file=records)
        with gateway_server(settings, keyring=KEYS, ready=False) as gw:
            store = gw.gateway.policy_store
            got: dict[str, object] = {}

            def ask() -> None:
                with httpx.stream("POST", gw.url + "/v1/chat/completions", timeout=60,
                                  headers={"Authorization": "Bearer key-acme-1"},
                                  json={"model": "auto", "stream": True, "max_tokens": 4,
                                        "messages": [{"role": "user", "content": "hello"}]}) as r:
                    got["rule"], got["events"] = r.headers["x-tiergate-rule"], [x for x in r.iter_lines() if x]

            t = threading.Thread(target=ask)
            t.start()
            assert cloud.app[OPENED].wait(30)  # the request is at the backend, held
            before = store.current.version
            _policy(policy, cloud.url, "second", "null")
            wait_until(lambda: store.current.version != before, timeout_s=30, what="the new policy version active")
            cloud.app[GATE].set()
            t.join(60)
            assert got["rule"] == "first" and got["events"][-1] == "data: [DONE]", got
            wait_until(lambda: (gw.gateway.registry.get_sample_value("tiergate_distill_records_total",
                                                                     {"result": "recorded"}) or 0) == 1,
                       what="the answer captured under the first version's distill section")
            assert gw.gateway.registry.get_sample_value("tiergate_requests_total", {
                "endpoint": "chat", "tier": "cloud", "rule": "first", "cache": "bypass", "status": "200"}) == 1
            after = httpx.post(gw.url + "/v1/chat/completions", headers={"Authorization": "Bearer key-acme-1"},
                               json={"model": "auto", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]},
                               timeout=30)
            assert after.status_code == 200 and after.headers["x-tiergate-rule"] == "second"
    lines = [json.loads(x) for x in records.read_text().splitlines()]
    assert [(r["tenant"], r["rule"]) for r in lines] == [("acme", "first")]


def test_the_default_policys_maintenance_probe_is_a_503_server_error_with_retry_after():
    """The shipped policy's kill switch: a `server_error` a client retries after Retry-After, not an
    `invalid_request_error` (which says the request itself is wrong)."""
    with gateway_server(Settings(policy=DEFAULT_POLICY, embedder=None, redis_url=None), keyring=KEYS,
                        ready=False) as gw:
        r = httpx.post(gw.url + "/v1/chat/completions", timeout=30,
                       headers={"Authorization": "Bearer key-acme-1", "x-tiergate-probe": "reject"},
                       json={"model": "auto", "messages": [{"role": "user", "content": "hello"}]})
    assert r.status_code == 503 and r.headers["retry-after"] == "30", (r.status_code, r.headers)
    assert r.json()["error"] | {"message": ""} == {"type": "server_error", "code": "maintenance", "param": None,
                                                   "message": ""}
    assert r.headers["x-tiergate-rule"] == "maintenance-probe"


def test_a_policy_rejection_is_typed_by_its_status_and_carries_retry_after_when_the_rule_gives_it(tmp_path):
    policy = tmp_path / "p.yaml"
    policy.write_text("""
version: 1
tiers:
  cloud: {kind: cloud, model: tiergate-cloud, stand_in: true, endpoints: ["http://127.0.0.1:9"]}
rules:
  - {name: busy, when: {headers: {x-test: busy}}, reject: {status: 429, message: "slow down", retry_after_s: 7}}
  - {name: banned, when: {headers: {x-test: banned}}, reject: {status: 403, message: "not for you"}}
  - {name: broken, when: {headers: {x-test: broken}}, reject: {status: 500, message: "nope", code: broken}}
  - {name: bad, when: {headers: {x-test: bad}}, reject: {status: 400, message: "bad"}}
  - {name: default, tier: cloud}
""")
    got = {}
    with gateway_server(Settings(policy=policy, embedder=None, redis_url=None), keyring=KEYS, ready=False) as gw:
        for case in ("busy", "banned", "broken", "bad"):
            r = httpx.post(gw.url + "/v1/chat/completions", timeout=30,
                           headers={"Authorization": "Bearer key-acme-1", "x-test": case},
                           json={"model": "auto", "messages": [{"role": "user", "content": "hello"}]})
            got[case] = (r.status_code, r.json()["error"]["type"], r.json()["error"]["code"],
                         r.headers.get("retry-after"))
    assert got == {"busy": (429, "rate_limit_error", "rejected_by_policy", "7"),
                   "banned": (403, "permission_error", "rejected_by_policy", None),
                   "broken": (500, "server_error", "broken", None),
                   "bad": (400, "invalid_request_error", "rejected_by_policy", None)}


def _two_versions(path: Path, url: str, tier: str, rule: str) -> None:
    path.write_text(f"""
version: 1
defaults: {{cache: {{enabled: false}}, timeouts: {{connect_s: 1, first_byte_s: 60, total_s: 60, queue_s: 60}}}}
tiers:
  {tier}: {{kind: cloud, model: tiergate-cloud, stand_in: true, endpoints: ["{url}"], max_concurrency: 1}}
rules:
  - name: {rule}
    tier: {tier}
""")


def test_a_reload_takes_effect_once_its_tiers_are_up_and_requests_queued_across_it_keep_their_tier(
        tmp_path, monkeypatch):
    """Version 1 sends everything to tier `old` (one request at a time); version 2 replaces it with tier `new`,
    whose pool's start-up the test holds. One request is held at the backend and one queued behind it; then the
    reload. While `new` starts, version 2 is the policy file's, yet a third request is still decided and served
    under version 1 (not decided for a tier that is not up yet: a 503). Once version 2 serves, the queued
    requests are still answered by `old` under rule r1; `old`'s pool stops only after every one of them reached
    its backend; and the next request goes to `new` under r2."""
    gate, starting, stopped = threading.Event(), threading.Event(), []
    real_make_pool = tiers_module.make_pool

    def make_pool(config, redis, cloud_metrics, access=None):
        pool = real_make_pool(config, redis, cloud_metrics, access)
        start, stop = pool.start, pool.stop

        async def held_start() -> None:
            if config.name == "new":
                starting.set()
                await asyncio.to_thread(gate.wait, 60)
            await start()

        async def recorded_stop() -> None:
            stopped.append((config.name, backend.app[HITS]))  # how many requests had reached the backend by then
            await stop()

        pool.start, pool.stop = held_start, recorded_stop
        return pool

    monkeypatch.setattr(tiers_module, "make_pool", make_pool)
    policy = tmp_path / "p.yaml"
    with aiohttp_server(make_app(chunks=2, mode="role_gated", model="cloud-model")) as backend:
        _two_versions(policy, backend.url, "old", "r1")
        with gateway_server(Settings(policy=policy, embedder=None, redis_url=None), keyring=KEYS) as gw:
            store, tiers = gw.gateway.policy_store, gw.gateway.tiers
            got: dict[str, tuple[int, str, str, str]] = {}

            def ask(name: str) -> None:
                with httpx.stream("POST", gw.url + "/v1/chat/completions", timeout=90,
                                  headers={"Authorization": "Bearer key-acme-1"},
                                  json={"model": "auto", "stream": True, "max_tokens": 2,
                                        "messages": [{"role": "user", "content": name}]}) as r:
                    events = [x for x in r.iter_lines() if x]
                    got[name] = (r.status_code, r.headers.get("x-tiergate-tier", ""),
                                 r.headers.get("x-tiergate-rule", ""), events[-1] if events else "")

            threads = [threading.Thread(target=ask, args=(n,)) for n in ("held", "queued", "in_the_window")]
            threads[0].start()
            assert backend.app[OPENED].wait(30)  # at the backend, held: `old`'s one slot is taken
            threads[1].start()
            wait_until(lambda: tiers["old"].admission.waiting == 1, timeout_s=30, what="a request queued at `old`")
            first = store.current.version
            _two_versions(policy, backend.url, "new", "r2")
            assert starting.wait(30)  # the new version is read; its tier is starting
            assert store.current.version != first and tiers.current.version == first
            threads[2].start()
            wait_until(lambda: tiers["old"].admission.waiting == 2, timeout_s=30,
                       what="the request sent during the reload queued at `old` too")
            gate.set()  # `new` is up: version 2 serves from now on
            wait_until(lambda: tiers.current.version == store.current.version, timeout_s=30, what="version 2 serving")
            assert stopped == []  # `old` is still held by three requests
            backend.app[GATE].set()
            for t in threads:
                t.join(90)
            wait_until(lambda: stopped != [], timeout_s=30, what="`old`'s pool stopped once its requests ended")
            assert got == {name: (200, "old", "r1", "data: [DONE]") for name in ("held", "queued", "in_the_window")}
            assert stopped == [("old", 3)] and tiers.held_versions == 1
            ask("after")
            assert got["after"] == (200, "new", "r2", "data: [DONE]")


# ---- the request flows one way ----------------------------------------------------------------------------------

_PKG = "tiergate.gateway."


def callbacks_up_the_stack(stack: list[str]) -> list[str]:
    """The gateway modules of one call stack (outermost first) that appear again after a different one: a callee
    calling back into a module that is still waiting on it. Consecutive frames of one module are one entry."""
    seen: list[str] = []
    bad = []
    for module in stack:
        if seen and seen[-1] == module:
            continue
        if module in seen:
            bad.append(" -> ".join([*seen, module]))
        seen.append(module)
    return bad


class PathRecorder:
    """A profiler hook (`sys.setprofile`, this thread only) that records, on every call into a gateway module,
    which gateway modules are on the stack. `entered`: the modules in the order first entered; `trail`: every
    entry into a module other than the last one entered."""

    def __init__(self) -> None:
        self.entered: list[str] = []
        self.trail: list[str] = []
        self.violations: set[str] = set()

    def __call__(self, frame, event: str, arg: object) -> None:
        if event != "call":
            return
        name = frame.f_globals.get("__name__", "")
        if not name.startswith(_PKG):
            return
        module = name.removeprefix(_PKG)
        if module not in self.entered:
            self.entered.append(module)
        if not self.trail or self.trail[-1] != module:
            self.trail.append(module)
        stack = []
        f = frame
        while f is not None:
            outer = f.f_globals.get("__name__", "")
            if outer.startswith(_PKG):
                stack.append(outer.removeprefix(_PKG))
            f = f.f_back
        self.violations.update(callbacks_up_the_stack(stack[::-1]))


def _in_order(trail: list[str], stages: list[str]) -> bool:
    """`stages` appear in `trail` in this order (other modules between them)."""
    it = iter(trail)
    return all(stage in it for stage in stages)


def test_the_check_for_callbacks_up_the_stack_can_fail() -> None:
    """The shape the issue names (dispatch calling the pipeline's body closure) is found; a way down is not."""
    assert callbacks_up_the_stack(["app", "pipeline", "dispatch", "pipeline"]) == [
        "app -> pipeline -> dispatch -> pipeline"]
    assert callbacks_up_the_stack(["app", "pipeline", "pipeline", "relay", "settlement", "accounting"]) == []


def test_a_request_flows_one_way_through_the_gateway(tmp_path: Path) -> None:
    """A streamed chat miss, a JSON cache hit and a cascade escalation, in process under a profiler hook: on no
    call stack does a gateway module call back into one that is waiting on it, and each path enters its main
    stages in order (the modules each entered are printed)."""
    # the other tests here need none of these
    from tests.gateway.conftest import write_policy
    from tests.gateway.test_settlement import AUTH, CHAT, KEYS
    from tests.support.inprocess import in_process

    paths: dict[str, list[str]] = {}
    with aiohttp_server(make_app(4, model="edge-model")) as edge, \
            aiohttp_server(make_app(4, model="cloud-model")) as cloud:
        plain = write_policy(tmp_path / "plain.yaml", [edge.url], [cloud.url])
        cascade = write_cascade_policy(tmp_path / "cascade.yaml", edge.url, cloud.url)
        stream = {**CHAT, "stream": True}

        async def warm_then(policy: Path, bodies: list[dict], traced: PathRecorder) -> list[httpx.Response]:
            async with in_process(Settings(policy=policy, embedder=None, redis_url=None), KEYS) as c:
                for b in bodies[:-1]:  # what the traced request needs first (a cache entry)
                    await c.post("/v1/chat/completions", json=b, headers=AUTH)
                sys.setprofile(traced)
                try:
                    return [await c.post("/v1/chat/completions", json=bodies[-1], headers=AUTH)]
                finally:
                    sys.setprofile(None)

        for name, policy, bodies, check in [
            ("stream miss", plain, [stream], lambda r: r.headers["x-tiergate-cache"] == "miss"),
            ("json hit", plain, [CHAT, CHAT], lambda r: r.headers["x-tiergate-cache"] == "hit-exact"),
            ("cascade escalation", cascade, [CHAT], lambda r: r.headers["x-tiergate-cascade"] == "escalated"),
        ]:
            rec = PathRecorder()
            (r,) = asyncio.run(warm_then(policy, bodies, rec))
            assert r.status_code == 200 and check(r), name
            assert rec.violations == set(), (name, rec.violations)
            paths[name] = rec.trail
            print(name, ":", " -> ".join(rec.entered))
    assert _in_order(paths["stream miss"], ["app", "pipeline", "dispatch", "relay", "settlement", "accounting"])
    assert _in_order(paths["json hit"], ["app", "pipeline", "relay", "settlement", "accounting"])
    assert "dispatch" not in paths["json hit"]
    assert _in_order(paths["cascade escalation"], ["app", "pipeline", "cascade", "dispatch", "relay", "settlement"])
