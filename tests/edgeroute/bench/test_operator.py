"""The operator's telemetry loop: the only way congestion reaches the gateway in
`bench netkv --live` (the workers keep their own network and never read the oracle)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx

from edgeroute.bench.live_pools import NOMINAL, PHYSICAL
from edgeroute.bench.operator import Telemetry, operate
from oracle.topology import Topology
from tests.support import closed_port

Start = Callable[..., tuple[str, Any]]
TOKEN = "test-admin-token"


async def test_congestion_reaches_the_gateway_from_the_workers_counters_late(
    start_worker: Start, start_gateway: Start
) -> None:
    physical = Topology.model_validate(PHYSICAL)
    url, worker = start_worker(
        role="decode",
        instance_id="d3",
        topology=physical,
        speedup=10.0,
        background={"cluster": 0.5, "pod": 0.2},
        seed=1,
    )
    # Hostile neighbours: a worker with no network counters, and one that is down.
    plain, _ = start_worker(speedup=10.0)
    down = f"http://127.0.0.1:{closed_port()}"
    gw, gateway = start_gateway([{"url": url, "id": "d3", "role": "decode"}], oracle=NOMINAL)
    headers = {"authorization": f"Bearer {TOKEN}"}

    async def congestion() -> dict[str, float]:
        async with httpx.AsyncClient() as c:
            state = (await c.get(gw + "/admin/oracle", headers=headers)).json()
        found: dict[str, float] = state["congestion"]
        return found

    assert await congestion() == {}
    task = asyncio.create_task(
        operate(gw, TOKEN, [down, plain, url], 10.0, Telemetry(delay=2.0, noise=0.0), seed=1)
    )
    try:
        for _ in range(600):
            found = await congestion()
            if found:
                break
            await asyncio.sleep(0.05)
    finally:
        task.cancel()
    assert set(found) == {"pod", "cluster"}
    assert 0.0 < found["pod"] < 0.95 and 0.0 < found["cluster"] < 0.95
    # The worker's own network is untouched by what the oracle was told.
    assert worker.config.topology is not None
    assert worker.config.topology.tier_bandwidth == PHYSICAL["tier_bandwidth"]
    assert gateway.pool.oracle is not None
    assert gateway.pool.oracle.tier_bandwidth == NOMINAL["tier_bandwidth"]
