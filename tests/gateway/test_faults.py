"""Faults under traffic: every accepted request completes or ends with an explicit error.

(Killed workers mid-stream, 5xx and garbage answers, Redis and the embedded store dying
are in test_proxy, test_errors and test_shared_state.)
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.support import WorkerProcess, replicas_on_redis, wait_until

Start = Callable[..., tuple[str, Any]]
CHAT = "/v1/chat/completions"
MODEL = "mistral-7b-chat"
TOKEN = {"authorization": "Bearer test-admin-token"}


def ask(url: str, max_tokens: int = 2, stream: bool = False) -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me something."}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    return httpx.post(url + CHAT, json=body, timeout=30)


def test_a_hanging_worker_times_out_opens_its_circuit_and_recovers(
    start_worker: Start, start_gateway: Start
) -> None:
    hung_url, hung = start_worker(enable_faults=True, speedup=20.0)
    ok_url, _ = start_worker(speedup=20.0)
    url, gw = start_gateway(
        [{"url": hung_url, "id": "hung"}, {"url": ok_url, "id": "ok"}],
        routing={"default": {"policy": "round_robin"}},
        timeouts={"connect": 0.5, "first_byte": 0.3, "response": 0.3, "idle": 1.0, "scrape": 0.5},
        circuit={"failures": 2, "open_seconds": 1.0},
    )
    hung.config.fault.mode = "hang"
    answers = [ask(url) for _ in range(8)]
    # The first byte times out on `hung`, and the request is retried on `ok`.
    assert all(r.status_code == 200 for r in answers)
    assert {r.headers["x-edgeroute-backend"] for r in answers} == {"ok"}
    # It opened (whether its 1 s cool-down has passed by now depends on the machine's
    # load, so that is not asked here).
    circuit = gw.pool.get("hung").circuit
    assert circuit.state.name != "CLOSED" and circuit.failures >= 2
    # Still hanging, but answering /health: past each cool-down one real request is
    # the trial, fails, and the circuit opens again. Health alone never closes it.
    wait_until(lambda: circuit.state.name == "HALF_OPEN", timeout=10)
    time.sleep(0.5)  # several good health probes
    assert circuit.state.name == "HALF_OPEN"
    assert ask(url).headers["x-edgeroute-backend"] == "ok"  # the trial failed, retried
    assert circuit.state.name == "OPEN"
    hung.config.fault.mode = "none"
    wait_until(lambda: circuit.state.name == "HALF_OPEN", timeout=10)
    wait_until(lambda: ask(url).status_code == 200 and circuit.state.name == "CLOSED")
    seen = Counter(ask(url).headers["x-edgeroute-backend"] for _ in range(6))
    assert seen == {"hung": 3, "ok": 3}


def test_draining_a_backend_during_traffic_loses_nothing(
    start_worker: Start, start_gateway: Start
) -> None:
    a_url, _ = start_worker(speedup=5.0)
    b_url, _ = start_worker(speedup=5.0)
    url, gw = start_gateway(
        [{"url": a_url, "id": "a"}, {"url": b_url, "id": "b"}],
        routing={"default": {"policy": "round_robin"}},
    )
    stop = threading.Event()
    results: list[tuple[float, int, str, bool]] = []

    def client() -> None:
        while not stop.is_set():
            started = time.monotonic()
            with httpx.stream(
                "POST",
                url + CHAT,
                timeout=30,
                json={
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "A story, please."}],
                    "max_tokens": 40,
                    "stream": True,
                },
            ) as r:
                lines = [line for line in r.iter_lines() if line.startswith("data:")]
            done = bool(lines) and lines[-1] == "data: [DONE]"
            backend = r.headers.get("x-edgeroute-backend", "")
            results.append((started, r.status_code, backend, done))

    threads = [threading.Thread(target=client) for _ in range(6)]
    for t in threads:
        t.start()
    wait_until(lambda: gw.pool.get("a").inflight > 0, timeout=10)
    r = httpx.post(url + "/admin/backends/a/drain", headers=TOKEN)
    assert r.status_code == 200
    wait_until(lambda: gw.pool.get("a").draining)
    drained = time.monotonic()
    # Streams that started after the drain have finished (some on `b`, none on `a`).
    wait_until(lambda: sum(1 for started, *_ in results if started > drained) >= 6, timeout=60)
    stop.set()
    for t in threads:
        t.join(30)
    assert results and all(status == 200 and done for _, status, _, done in results)
    # Streams that were on `a` when it was drained finished; none started there after.
    assert any(backend == "a" and started < drained for started, _, backend, _ in results)
    later = {backend for started, _, backend, _ in results if started > drained}
    assert later == {"b"}
    wait_until(lambda: gw.pool.total_inflight() == 0)


def test_one_replica_dies_and_the_other_keeps_serving(tmp_path: Path) -> None:
    workers = [WorkerProcess("--profile", "instant") for _ in range(2)]
    config = tmp_path / "gateway.yaml"
    config.write_text(
        yaml.safe_dump({"backends": [{"id": f"w{i}", "url": w.url} for i, w in enumerate(workers)]})
    )
    env = {"EDGEROUTE_ADMIN_TOKEN": "replica-token", "EDGEROUTE_REPLICA_TTL": "1.0"}
    try:
        with replicas_on_redis(config, env) as gateways:
            body = {"model": "instant", "messages": [{"role": "user", "content": "hi"}]}

            def send(i: int) -> int:
                g = gateways[1] if i >= 40 else gateways[i % 2]  # after the kill, only r1
                return httpx.post(g.url + CHAT, json=body, timeout=10).status_code

            with ThreadPoolExecutor(4) as pool:
                first = list(pool.map(send, range(40)))
                gateways[0].kill()
                after = list(pool.map(send, range(40, 200)))
            assert first == [200] * 40 and after == [200] * 160
            # The survivor stops counting the dead replica once its record expires.
            admin = {"authorization": "Bearer replica-token"}

            def replicas() -> int:
                status = httpx.get(gateways[1].url + "/admin/status", headers=admin).json()
                return int(status["replicas"])

            wait_until(lambda: replicas() == 1, timeout=10)
    finally:
        for w in workers:
            w.kill()
