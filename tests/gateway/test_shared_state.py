"""Several replicas on one Redis act as one; Redis can die and come back."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx

from tests.support import RedisProcess, hold_streams, wait_until

Start = Callable[..., tuple[str, Any]]
TOKEN = {"authorization": "Bearer test-admin-token"}
MODEL = "mistral-7b-chat"


def test_two_replicas_see_each_others_inflight_load(
    start_worker: Start, start_gateway: Start, redis_server: RedisProcess
) -> None:
    a, _ = start_worker(speedup=1.0)
    b, _ = start_worker(speedup=1.0)
    backends = [{"url": a, "id": "a"}, {"url": b, "id": "b"}]
    # Engine stats are never fresh enough to steer here: only in-flight counts do.
    common = {
        "redis_url": redis_server.url,
        "stale_after": 0.0001,
        "routing": {"default": {"policy": "least_load"}},
    }
    url1, gw1 = start_gateway(backends, replica_id="r1", **common)
    url2, gw2 = start_gateway(backends, replica_id="r2", **common)
    stop = threading.Event()
    # Four long streams through replica 1, all pinned to backend a by draining b.
    httpx.post(url1 + "/admin/backends/b/drain", headers=TOKEN)
    threads = hold_streams(url1, MODEL, 4, stop)
    try:
        wait_until(lambda: gw1.pool.get("a").inflight == 4)
        httpx.post(url1 + "/admin/backends/b/undrain", headers=TOKEN)
        # Replica 2 learns of them through Redis, and routes around them.
        wait_until(lambda: gw2.pool.get("a").remote_inflight == 4, timeout=3)
        wait_until(lambda: not gw2.pool.get("b").draining, timeout=3)
        status = httpx.get(url2 + "/admin/status", headers=TOKEN).json()
        assert status["replicas"] == 2 and status["store_up"]
        picks = Counter(
            httpx.post(
                url2 + "/v1/chat/completions",
                json={
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "x"}],
                    "max_tokens": 1,
                },
            ).headers["x-edgeroute-backend"]
            for _ in range(5)
        )
        assert picks == {"b": 5}
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    wait_until(lambda: gw2.pool.get("a").remote_inflight == 0, timeout=3)


def test_redis_killed_and_restarted_under_traffic_loses_no_request(
    start_worker: Start, start_gateway: Start, redis_server: RedisProcess
) -> None:
    a, _ = start_worker()
    b, _ = start_worker()
    url, gw = start_gateway([a, b], redis_url=redis_server.url)
    statuses: Counter[int] = Counter()
    stop = threading.Event()

    def traffic() -> None:
        with httpx.Client(timeout=10) as c:
            while not stop.is_set():
                r = c.post(
                    url + "/v1/chat/completions",
                    json={
                        "model": MODEL,
                        "messages": [{"role": "user", "content": "x"}],
                        "max_tokens": 2,
                    },
                )
                statuses[r.status_code] += 1

    threads = [threading.Thread(target=traffic) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: sum(statuses.values()) > 10)
        redis_server.kill()
        wait_until(lambda: "edgeroute_store_up 0.0" in httpx.get(url + "/metrics").text)
        before = sum(statuses.values())
        # Still routing, on the last snapshot.
        wait_until(lambda: sum(statuses.values()) > before + 10, timeout=30)
        redis_server.start()
        wait_until(lambda: "edgeroute_store_up 1.0" in httpx.get(url + "/metrics").text, timeout=10)
        back = sum(statuses.values())
        wait_until(lambda: sum(statuses.values()) > back + 10, timeout=30)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    # Traffic went on in each phase (the waits above: 10 more answers before the kill,
    # while the store was down, and after it came back); how many in all is the
    # machine's speed, not the gateway's behaviour. Every one of them was answered.
    assert set(statuses) == {200}, statuses


def test_embedded_store_is_revived_when_its_process_dies(
    start_worker: Start, start_gateway: Start
) -> None:
    a, _ = start_worker()
    url, gw = start_gateway([a])  # no redis_url: embedded Valkey
    embedded = gw.store.embedded
    assert embedded is not None and embedded.alive()
    pid = embedded.pid
    import os
    import signal

    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: embedded.alive() and embedded.pid != pid, timeout=10)
    wait_until(lambda: "edgeroute_store_up 1.0" in httpx.get(url + "/metrics").text, timeout=5)
    # The revived store got this replica's config back.
    listed = httpx.get(url + "/admin/backends", headers=TOKEN).json()["backends"]
    assert len(listed) == 1
    r = httpx.post(
        url + "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1},
    )
    assert r.status_code == 200
