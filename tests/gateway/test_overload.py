"""Twice the pool's capacity, sustained: the gateway sheds the excess with 429 and
Retry-After instead of queueing without bound, loses nothing, and its memory stays
put from one burst to the next. (Goodput against offered load is measured by
`edgeroute bench overload`.)"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import httpx
import yaml

from edgeroute.bench.overload import rss_mb
from tests.support import GatewayProcess, WorkerProcess

LIMIT = 8
BODY = {
    "model": "mistral-7b-chat",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 8,
}


def burst(url: str, clients: int, requests_each: int) -> tuple[Counter[str], list[int]]:
    """Closed-loop clients; returns the outcomes and the in-flight counts seen meanwhile."""
    outcomes: Counter[str] = Counter()
    seen: list[int] = []
    lock = threading.Lock()
    done = threading.Event()

    def client() -> None:
        with httpx.Client(timeout=30) as c:
            for _ in range(requests_each):
                try:
                    r = c.post(url + "/v1/chat/completions", json=BODY)
                except httpx.HTTPError as exc:
                    outcome = type(exc).__name__
                else:
                    outcome = str(r.status_code)
                    if r.status_code == 429:
                        assert int(r.headers["retry-after"]) >= 1
                        assert r.json()["error"]["type"] == "rate_limit_error"
                with lock:
                    outcomes[outcome] += 1

    def watch() -> None:
        with httpx.Client(timeout=5) as c:
            while not done.is_set():
                text = c.get(url + "/metrics").text
                for line in text.splitlines():
                    if line.startswith("edgeroute_replica_inflight_requests "):
                        seen.append(int(float(line.split()[1])))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    watcher = threading.Thread(target=watch)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    done.set()
    watcher.join(10)
    return outcomes, seen


def test_twice_the_capacity_is_shed_not_queued_and_memory_stays_bounded(tmp_path: Path) -> None:
    workers = [WorkerProcess("--speedup", "10") for _ in range(2)]
    config = tmp_path / "gateway.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "max_inflight": LIMIT,
                "backends": [{"id": f"w{i}", "url": w.url} for i, w in enumerate(workers)],
            }
        )
    )
    gateway = GatewayProcess(config, {"EDGEROUTE_ADMIN_TOKEN": "overload-token"})
    try:
        first, seen = burst(gateway.url, 2 * LIMIT, 40)
        rss_first = rss_mb(gateway.proc.pid)
        second, seen2 = burst(gateway.url, 2 * LIMIT, 40)
        rss_second = rss_mb(gateway.proc.pid)
        for outcomes in (first, second):
            # Every request was answered: served, or shed with Retry-After.
            assert set(outcomes) <= {"200", "429"}, outcomes
            assert sum(outcomes.values()) == 2 * LIMIT * 40
            assert outcomes["200"] > 0 and outcomes["429"] > 0
        # Never more in flight than the limit: the excess is refused, not queued.
        assert seen and max(seen + seen2) <= LIMIT
        # Nothing accumulates from one burst to the next.
        assert rss_second - rss_first < 20, (rss_first, rss_second)
        assert httpx.post(gateway.url + "/v1/chat/completions", json=BODY).status_code == 200
    finally:
        gateway.kill()
        for w in workers:
            w.kill()
