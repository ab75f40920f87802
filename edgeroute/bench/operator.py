"""The operator's side of NetKV, for live runs: telemetry from the network, pushed to
the gateway's oracle late and inexactly.

Every `period` (emulated) seconds it reads each decode worker's link counters (the
background utilisation of each tier into the worker and the seconds its link was busy
with transfers), computes each tier's utilisation over the period averaged over the
workers, adds multiplicative noise, and `delay` seconds later sends it to
`PUT /admin/oracle/congestion`. The workers never read the oracle: this loop is the
only way congestion reaches the gateway.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from dataclasses import dataclass

import httpx

from gateway.promtext import read_by_label


@dataclass(frozen=True)
class Telemetry:
    period: float = 1.0  # emulated seconds between samples
    delay: float = 2.0  # emulated seconds from a sample to the oracle
    noise: float = 0.1  # relative error of a reported utilisation (1 sigma)


async def operate(
    gateway: str,
    token: str,
    workers: list[str],
    speedup: float,
    telemetry: Telemetry,
    seed: int,
) -> None:
    """Runs until cancelled."""
    rng = random.Random(seed)
    busy: dict[tuple[str, str], float] = {}
    queue: deque[tuple[float, dict[str, float]]] = deque()
    headers = {"authorization": f"Bearer {token}"}
    loop = asyncio.get_running_loop()
    async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
        while True:
            now = loop.time()
            per_tier: dict[str, list[float]] = {}
            for url in workers:
                try:
                    text = (await client.get(url + "/metrics")).text
                except httpx.HTTPError:
                    continue
                background = read_by_label(text, "emulator:link_background", "tier")
                seconds = read_by_label(text, "emulator:link_busy_seconds_total", "tier")
                for tier, level in background.items():
                    before = busy.get((url, tier))
                    busy[(url, tier)] = seconds.get(tier, 0.0)
                    share = 0.0
                    if before is not None:
                        share = min(1.0, (busy[(url, tier)] - before) / telemetry.period)
                    per_tier.setdefault(tier, []).append(level + (1 - level) * share)
            sample = {
                tier: min(0.99, max(0.0, sum(v) / len(v) * (1 + rng.gauss(0.0, telemetry.noise))))
                for tier, v in per_tier.items()
            }
            queue.append((now + telemetry.delay / speedup, sample))
            while queue and queue[0][0] <= now:
                _, due = queue.popleft()
                if due:
                    await client.put(
                        gateway + "/admin/oracle/congestion", json=due, headers=headers
                    )
            await asyncio.sleep(telemetry.period / speedup)
