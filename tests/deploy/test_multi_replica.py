"""Two gateway processes on one Redis act as one: in-flight load and oracle updates
made through one replica steer the other. (Kubernetes runs replicas the same way.)"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.gateway.test_oracle_api import TOPOLOGY
from tests.support import (
    GatewayProcess,
    WorkerProcess,
    hold_streams,
    replicas_on_redis,
    wait_until,
)

TOKEN = {"authorization": "Bearer multi-replica-token"}
MODEL = "mistral-7b-chat"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[GatewayProcess, GatewayProcess]]:
    workers = [WorkerProcess("--profile", MODEL) for _ in range(4)]
    config = tmp_path / "gateway.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "routing": {"default": {"policy": "least_load"}},
                "backends": [
                    {"id": name, "url": w.url} for name, w in zip("abcd", workers, strict=True)
                ],
            }
        )
    )
    env = {
        "EDGEROUTE_ADMIN_TOKEN": TOKEN["authorization"].removeprefix("Bearer "),
        "EDGEROUTE_STALE_AFTER": "0.0001",  # only in-flight counts steer
    }
    try:
        with replicas_on_redis(config, env) as (first, second):
            yield first, second
    finally:
        for w in workers:
            w.kill()


def backends(g: GatewayProcess) -> dict[str, dict[str, Any]]:
    body = httpx.get(g.url + "/admin/backends", headers=TOKEN).json()
    return {b["id"]: b for b in body["backends"]}


def test_load_through_one_replica_steers_the_other(
    cluster: tuple[GatewayProcess, GatewayProcess],
) -> None:
    r1, r2 = cluster
    for name in "cd":
        assert httpx.post(r1.url + f"/admin/backends/{name}/drain", headers=TOKEN).is_success
    wait_until(lambda: all(backends(r2)[n]["draining"] for n in "cd"), timeout=5)
    stop = threading.Event()
    threads = hold_streams(r1.url, MODEL, 6, stop, timeout=60)
    try:
        wait_until(lambda: sum(b["inflight"] for b in backends(r1).values()) == 6, timeout=10)
        for name in "cd":
            httpx.post(r1.url + f"/admin/backends/{name}/undrain", headers=TOKEN)
        # Replica 2 sees replica 1's streams on a and b, and c and d open again.
        wait_until(
            lambda: (
                (s := backends(r2))["a"]["remote_inflight"] == 3
                and s["b"]["remote_inflight"] == 3
                and not s["c"]["draining"]
                and not s["d"]["draining"]
            ),
            timeout=5,
        )
        picks: Counter[str] = Counter()
        for _ in range(4):
            r = httpx.post(
                r2.url + "/v1/chat/completions",
                timeout=30,
                json={
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "x"}],
                    "max_tokens": 1,
                },
            )
            assert r.status_code == 200
            picks[r.headers["x-edgeroute-backend"]] += 1
        assert set(picks) <= {"c", "d"}, picks  # no herding onto the busy backends
    finally:
        stop.set()
        for t in threads:
            t.join(60)


def test_an_oracle_update_on_one_process_reaches_the_other(
    cluster: tuple[GatewayProcess, GatewayProcess],
) -> None:
    r1, r2 = cluster
    assert httpx.put(r1.url + "/admin/oracle/topology", headers=TOKEN, json=TOPOLOGY).is_success
    r = httpx.put(r1.url + "/admin/oracle/congestion", headers=TOKEN, json={"cluster": 0.6})
    assert r.is_success

    def seen() -> bool:
        r = httpx.get(r2.url + "/admin/oracle", headers=TOKEN)
        return r.status_code == 200 and r.json().get("congestion") == {"cluster": 0.6}

    wait_until(seen, timeout=3)  # the store is re-read every sync_interval (0.2 s)
