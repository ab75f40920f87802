"""`edgeroute bench growth`: what routing costs as a deployment grows.

Three dimensions, each measured on the gateway's own data structures (the backend
pool and its routing view, the shared store) rather than on a model of them:

- backends (8 to 1,024): one decision on the pool's view, per policy, and the
  memory the pool holds for them (tracemalloc);
- in-flight requests (to 10,000, spread over 64 backends): the view update a
  dispatch causes plus one decision, for least_load and for QoS-DRL (which reads
  every in-flight request), and the memory of the in-flight records;
- replicas (1 to 64, on one embedded Valkey): one replica's store sync, which
  publishes its counts and reads every other replica's.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from edgeroute.results_io import Plot, write
from gateway.backends import BackendPool, InflightEntry
from gateway.settings import BackendConfig, CircuitConfig
from gateway.store import EmbeddedStore, SharedStore
from policies import PipelineSpec, RequestInfo, build_policy
from policies.text import block_hashes

MODEL = "m"
PROMPT = "Summarise the quarterly report for the board. " * 40


def _pool(n: int, track: bool = False) -> BackendPool:
    pool = BackendPool(CircuitConfig(), stale_after=5.0, prefix_entries=20_000)
    pool.track_requests = track
    pool.set_configs(
        BackendConfig(url=f"http://10.{i // 250}.0.{i % 250}:8000", id=f"b{i}", models=[MODEL])
        for i in range(n)
    )
    return pool


_TEMPLATE = RequestInfo(
    model=MODEL,
    prompt_tokens=len(PROMPT) // 4,
    block_hashes=block_hashes(PROMPT, 64),  # hashed once: the proxy's cost, not the policy's
    now=time.monotonic(),
    prompt=PROMPT,
)


def _request(seq: int) -> RequestInfo:
    return replace(_TEMPLATE, seq=seq, entropy=seq * 2654435761 % (1 << 63))


def _median_us(fn: Callable[[int], object], calls: int, runs: int = 5) -> float:
    means = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for i in range(calls):
            fn(i)
        means.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(means)


def _memory_kb(build: Callable[[], object]) -> tuple[object, float]:
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    built = build()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return built, (after - before) / 1024


def _backend_rows(n: int, policies: list[str], calls: int) -> list[dict[str, Any]]:
    pool, kb = _memory_kb(lambda: _pool(n))
    assert isinstance(pool, BackendPool)
    rows = []
    for name in policies:
        policy = build_policy(PipelineSpec(policy=name))

        def decide(i: int) -> None:
            policy.decide(_request(i), pool.view)  # noqa: B023  (called before the next)

        us = _median_us(decide, calls)
        rows.append(
            {
                "dimension": "backends",
                "size": n,
                "policy": name,
                "decision_us": round(us, 1),
                "memory_kb": round(kb, 1),
            }
        )
        print(f"  backends={n:5d} {name:<18} {us:8.1f} us  pool {kb:8.1f} KiB", flush=True)
    return rows


def backends_rows(sizes: list[int], policies: list[str], calls: int) -> list[dict[str, Any]]:
    return [row for n in sizes for row in _backend_rows(n, policies, calls)]


def _inflight_row(name: str, k: int, calls: int) -> dict[str, Any]:
    policy = build_policy(PipelineSpec(policy=name))
    pool = _pool(64, track=name == "qos_drl")  # QoS-DRL reads every in-flight request
    backends = list(pool)

    def fill() -> list[InflightEntry]:
        entries = [InflightEntry(100, time.monotonic(), generated=5) for _ in range(k)]
        for i, e in enumerate(entries):
            pool.dispatched(backends[i % len(backends)], (), e)
        return entries

    entries, kb = _memory_kb(fill)

    def step(i: int) -> None:
        # One dispatch and one completion, then a decision on the updated view.
        b = backends[i % len(backends)]
        e = InflightEntry(100, time.monotonic())
        pool.dispatched(b, (), e)
        pool.finished(b, e)
        policy.decide(_request(i), pool.view)

    us = _median_us(step, max(20, calls // (1 + k // 500)))
    print(f"  in-flight={k:6d} {name:<18} {us:8.1f} us  records {kb:8.1f} KiB", flush=True)
    assert isinstance(entries, list)
    return {
        "dimension": "in-flight",
        "size": k,
        "policy": name,
        "decision_us": round(us, 1),
        "memory_kb": round(kb, 1),
    }


def inflight_rows(sizes: list[int], policies: list[str], calls: int) -> list[dict[str, Any]]:
    return [_inflight_row(name, k, calls) for name in policies for k in sizes]


async def _replica_rows(sizes: list[int], backends: int, calls: int) -> list[dict[str, Any]]:
    server = EmbeddedStore()
    server.start()
    rows = []
    try:
        counts = {f"b{i}": i % 7 for i in range(backends)}
        for r in sizes:
            stores = [SharedStore(server.url, f"r{i}", 30.0) for i in range(r)]
            for s in stores:
                await s.start()
                await s.sync(counts)
            times = []
            for _ in range(calls):
                t0 = time.perf_counter()
                result = await stores[0].sync(counts)
                times.append(time.perf_counter() - t0)
            assert result.replicas == r
            rows.append(
                {
                    "dimension": "replicas",
                    "size": r,
                    "policy": f"store sync, {backends} backends",
                    "decision_us": round(statistics.median(times) * 1e6, 1),
                    "memory_kb": "",
                }
            )
            print(f"  replicas={r:4d} sync {rows[-1]['decision_us']:8.1f} us", flush=True)
            for s in stores:
                await s.close()
    finally:
        server.stop()
    return rows


def main(quick: bool, json_path: str | None) -> None:
    calls = 200 if quick else 2000
    backend_sizes = [8, 64] if quick else [8, 64, 256, 1024]
    inflight_sizes = [0, 1000] if quick else [0, 1000, 10_000]
    replica_sizes = [1, 4] if quick else [1, 4, 16, 64]
    print("decision time and memory against the number of backends", flush=True)
    rows = backends_rows(backend_sizes, ["least_load", "cla", "session_affinity"], calls)
    print("against in-flight requests (64 backends)", flush=True)
    rows += inflight_rows(inflight_sizes, ["least_load", "qos_drl"], calls)
    print("against replicas sharing one store", flush=True)
    rows += asyncio.run(_replica_rows(replica_sizes, 64, 50 if quick else 300))
    write(
        "growth",
        {"command": "edgeroute bench growth" + (" --quick" if quick else ""), "calls": calls},
        rows,
        ["dimension", "size", "policy", "decision_us", "memory_kb"],
        json_path,
        quick=quick,
        plot=Plot(
            "size",
            ("decision_us", "memory_kb"),
            ("dimension", "policy"),
            "Decision time and memory as backends, in-flight requests and replicas grow",
            log_x=True,
            log_y=True,
        ),
        notes=(
            "`decision_us`: for backends, one decision on the pool's view (a 480-token prompt "
            "with its block hashes, computed beforehand as the proxy does); for in-flight, one dispatch, one completion and one "
            "decision on the updated view; for replicas, one store sync (publish own "
            "counts, read all others'), which runs every `sync_interval` off the request "
            "path. `memory_kb`: what tracemalloc saw the pool (backends) or the in-flight "
            "records (in-flight) allocate."
        ),
    )
