"""The gateway as Prism's global scheduler, with live MoE workers."""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import redis

from tests.support import RedisProcess, needs_data, wait_until

Start = Callable[..., tuple[str, Any]]
TOKEN = {"authorization": "Bearer test-admin-token"}
MODEL = "moe"
pytestmark = needs_data("the MoE routing data")


def draining(gw: Any, backend: str, state: bool) -> bool:
    """Is `backend` draining (`state` True) or serving (False) in the gateway's pool?"""
    return bool(gw.pool.get(backend).draining) is state


def ask(url: str, task: str) -> str:
    r = httpx.post(
        url + "/v1/chat/completions",
        timeout=30,
        headers={"x-edgeroute-task": task},
        json={
            "model": MODEL,
            "max_tokens": 12,
            "messages": [{"role": "user", "content": f"A {task} problem."}],
        },
    )
    assert r.status_code == 200, r.text
    return str(r.headers["x-edgeroute-backend"])


def test_a_plan_is_pushed_to_the_workers_and_requests_follow_the_map(
    start_worker: Start, start_gateway: Start
) -> None:
    halves = {
        "a": [(la, e) for la in range(32) for e in range(4)],
        "b": [(la, e) for la in range(32) for e in range(4, 8)],
    }
    backends: list[dict[str, Any]] = []
    for name, hosted in halves.items():
        url, _ = start_worker(
            profile="mixtral-8x7b-chat",
            speedup=20.0,
            served_model_names=["mixtral-8x7b-chat", MODEL],
            moe={"hosted": hosted},
            admin_token="worker-secret",
        )
        # 160 expert slots each: all 256 experts once, and the hottest on both.
        backends.append(
            {
                "url": url,
                "id": name,
                "moe": {
                    "gpu_memory_gb": [160 * 0.35],
                    "expert_gb": 0.35,
                    "io_gbps": [50.0],
                    "admin_token": "worker-secret",
                },
            }
        )
    url, gw = start_gateway(
        backends, routing={"default": {"policy": "prism"}}, prism_replan_seconds=3600
    )
    # Each class runs on one worker for a while (the other drained), as after a shift.
    for busy, idle, task in (("a", "b", "gsm8k"), ("b", "a", "humaneval")):
        httpx.post(url + f"/admin/backends/{idle}/drain", headers=TOKEN)
        wait_until(functools.partial(draining, gw, idle, True))
        assert {ask(url, task) for _ in range(6)} == {busy}
        httpx.post(url + f"/admin/backends/{idle}/undrain", headers=TOKEN)
        wait_until(functools.partial(draining, gw, idle, False))

    r = httpx.post(url + "/admin/prism/plan", headers=TOKEN, timeout=120)
    assert r.status_code == 200 and r.json()["adopted"]
    state = httpx.get(url + "/admin/prism", headers=TOKEN).json()
    assert len(state["history"]) == 1 and state["map"]["a"]["experts"] == 160
    local = re.findall(
        r'^edgeroute_expert_local_ratio\{backend="(\w)"\} (\S+)$',
        httpx.get(url + "/metrics").text,
        re.MULTILINE,
    )
    assert {b for b, _ in local} == {"a", "b"} and all(0 < float(v) <= 1 for _, v in local)
    for b in backends:  # the workers applied their new experts
        stats = httpx.get(b["url"] + "/moe/stats").json()
        assert stats["migrations"] == 1 and len(stats["hosted"]) == 160

    # Routing by the map: each class goes to the worker that now holds its experts.
    picks = {task: Counter(ask(url, task) for _ in range(6)) for task in ("gsm8k", "humaneval")}
    assert picks["gsm8k"].most_common(1)[0][0] == "a", picks
    assert picks["humaneval"].most_common(1)[0][0] == "b", picks

    assert httpx.post(url + "/admin/prism/freeze", headers=TOKEN).json()["frozen"]
    assert httpx.get(url + "/admin/prism").status_code == 401
    # The workers' admin token is used, never shown.
    for path in ("/admin/backends", "/admin/prism", "/metrics"):
        r = httpx.get(url + path, headers=TOKEN)
        assert r.status_code == 200 and "worker-secret" not in r.text


def test_a_worker_that_refuses_its_placement_is_a_502_and_keeps_its_experts(
    start_worker: Start, start_gateway: Start
) -> None:
    # The hostile twin of the push: worker "b" refuses it (the gateway holds a wrong
    # token for it), worker "a" takes it.
    backends: list[dict[str, Any]] = []
    for name, lo, token in (("a", 0, "worker-secret"), ("b", 4, "not-the-secret")):
        hosted = [(la, e) for la in range(32) for e in range(lo, lo + 4)]
        url, _ = start_worker(
            profile="mixtral-8x7b-chat",
            speedup=20.0,
            served_model_names=["mixtral-8x7b-chat", MODEL],
            moe={"hosted": hosted},
            admin_token="worker-secret",
        )
        moe = {"gpu_memory_gb": [160 * 0.35], "expert_gb": 0.35, "io_gbps": [50.0]}
        backends.append({"url": url, "id": name, "moe": {**moe, "admin_token": token}})
    url, gw = start_gateway(
        backends, routing={"default": {"policy": "prism"}}, prism_replan_seconds=3600
    )
    for task in ("gsm8k", "humaneval"):
        ask(url, task)
    r = httpx.post(url + "/admin/prism/plan", headers=TOKEN, timeout=120)
    assert r.status_code == 502, r.text
    error = r.json()["error"]
    assert error["code"] == "upstream_error" and "b: answered 401" in error["message"]
    assert "a:" not in error["message"]
    stats = {b["id"]: httpx.get(b["url"] + "/moe/stats").json() for b in backends}
    assert stats["a"]["migrations"] == 1 and len(stats["a"]["hosted"]) == 160
    assert stats["b"]["migrations"] == 0 and len(stats["b"]["hosted"]) == 128
    state = httpx.get(url + "/admin/prism", headers=TOKEN).json()
    assert state["map"]["a"]["experts"] == 160 and state["map"]["b"]["experts"] == 128
    assert state["candidate"]["failed_pushes"] == {"b": "answered 401"}
    assert "not-the-secret" not in r.text and "worker-secret" not in r.text


def test_replicas_share_the_plan_the_freeze_and_one_planner(
    start_worker: Start, start_gateway: Start, redis_server: RedisProcess
) -> None:
    backends: list[dict[str, Any]] = []
    for name, experts in (("a", range(4)), ("b", range(4, 8))):
        url, _ = start_worker(
            profile="mixtral-8x7b-chat",
            speedup=20.0,
            served_model_names=["mixtral-8x7b-chat", MODEL],
            moe={"hosted": [(la, e) for la in range(32) for e in experts]},
            admin_token="worker-secret",
        )
        moe = {
            "gpu_memory_gb": [160 * 0.35],
            "expert_gb": 0.35,
            "io_gbps": [50.0],
            "admin_token": "worker-secret",
        }
        backends.append({"url": url, "id": name, "moe": moe})
    common = {"redis_url": redis_server.url, "prism_replan_seconds": 3600}
    url1, gw1 = start_gateway(backends, replica_id="r1", **common)
    url2, gw2 = start_gateway(backends, replica_id="r2", **common)
    for task in ("gsm8k", "humaneval"):
        ask(url1, task)

    assert httpx.post(url1 + "/admin/prism/plan", headers=TOKEN, timeout=120).json()["adopted"]

    def seen_by_r2() -> bool:
        state = httpx.get(url2 + "/admin/prism", headers=TOKEN).json()
        return len(state["history"]) == 1 and state["map"]["a"]["experts"] == 160

    wait_until(seen_by_r2, timeout=15)
    httpx.post(url2 + "/admin/prism/freeze", headers=TOKEN)
    wait_until(lambda: gw1.prism.frozen, timeout=15)
    # Exactly one replica holds the planner lease.
    holder = redis.Redis.from_url(redis_server.url, decode_responses=True).get(
        "edgeroute:prism:planner"
    )
    assert holder in ("r1", "r2")


def moe_pool(start_worker: Start, io_gbps: float) -> list[dict[str, Any]]:
    backends: list[dict[str, Any]] = []
    for name, lo in (("a", 0), ("b", 4)):
        url, _ = start_worker(
            profile="mixtral-8x7b-chat",
            speedup=20.0,
            served_model_names=["mixtral-8x7b-chat", MODEL],
            moe={"hosted": [(la, e) for la in range(32) for e in range(lo, lo + 4)]},
            admin_token="worker-secret",
        )
        moe = {"gpu_memory_gb": [160 * 0.35], "expert_gb": 0.35, "io_gbps": [io_gbps]}
        backends.append({"url": url, "id": name, "moe": {**moe, "admin_token": "worker-secret"}})
    return backends


def decisions_after(url: str, task: str, count: int) -> list[dict[str, Any]]:
    """Sends `task` requests until the scheduler has made `count` unforced decisions."""
    for _ in range(2000):
        ask(url, task)
        state = httpx.get(url + "/admin/prism", headers=TOKEN).json()
        made = [h for h in state["history"] if not h["forced"]]
        candidate = state["candidate"]
        if candidate is not None and not candidate["forced"]:
            if candidate["adopted"] and len(made) >= count:
                return made
            if not candidate["adopted"]:
                return [candidate]
    raise AssertionError("the scheduler made no decision")


def test_the_scheduler_adopts_on_its_own_after_a_shift_in_traffic(
    start_worker: Start, start_gateway: Start
) -> None:
    backends = moe_pool(start_worker, io_gbps=400.0)  # experts move fast
    url, _ = start_gateway(
        backends, routing={"default": {"policy": "round_robin"}}, prism_replan_seconds=3
    )
    first = decisions_after(url, "gsm8k", 1)[0]
    assert first["adopted"] and first["reason"].startswith("C(P') + T_mig < C(P)")
    assert first["expected_cost_s"] + first["migration_s"] < first["current_cost_s"]
    assert first["calls_per_s"] > 0 and first["horizon_s"] == 3
    # The mix shifts to a class whose hot experts are others (the emulated workers give
    # a class without measurements a permutation of a measured one's experts): the
    # next plan is made from its activations, and moves experts again.
    made = decisions_after(url, "contracts", 2)
    assert len(made) >= 2 and made[-1]["at"] > first["at"]
    migrations = [httpx.get(b["url"] + "/moe/stats").json()["migrations"] for b in backends]
    assert min(migrations) >= 1 and max(migrations) >= 2


def test_the_scheduler_refuses_a_plan_whose_migration_costs_too_much(
    start_worker: Start, start_gateway: Start
) -> None:
    # The same traffic, but experts move at a kilobyte a second.
    backends = moe_pool(start_worker, io_gbps=1e-6)
    url, _ = start_gateway(
        backends, routing={"default": {"policy": "round_robin"}}, prism_replan_seconds=3
    )
    (decision,) = decisions_after(url, "gsm8k", 1)
    assert not decision["adopted"]
    assert decision["reason"] == "kept: the migration costs more than the remote calls it saves"
    assert decision["expected_cost_s"] < decision["current_cost_s"] < decision["migration_s"]
    state = httpx.get(url + "/admin/prism", headers=TOKEN).json()
    assert state["history"] == []
    for b in backends:
        assert httpx.get(b["url"] + "/moe/stats").json()["migrations"] == 0
