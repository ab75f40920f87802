"""Keeping slow decisions warm while the gateway idles.

On this project's test machine the QoS policy's decision takes 100-130 us when
decisions follow one another, and two to six times as long once the gateway's core
has idled for 1-10 ms: the core has slept and the graph and code have left its
caches (docs/performance.md, "Keeping the decision warm"). With `keep_warm_ms` set,
the gateway repeats each warmable policy's last decision whenever it has made none
for that long, and the next real one finds the core awake and the caches warm. The
price is one decision per period without decisions, on the event loop: a request that
arrives during one waits for it, and so do the chunks of streams relayed meanwhile (no
new decision is not no work: long streams still flow). It is paid only within
`keep_warm_for_ms` of the last decision: past it the loop sleeps until the next
decision wakes it, so a gateway without traffic spends nothing on it, and the first
request after a long silence pays for the cold core once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from prometheus_client import Counter

from gateway.metrics import series
from gateway.routes import Routes

log = logging.getLogger("edgeroute.gateway")

# How long to sleep while no policy in use can be warmed: routes change on reload.
IDLE_CHECK = 1.0


async def keep_warm(
    period: float,
    window: float,
    routes: Routes,
    decided_at: Callable[[], float],
    decided: asyncio.Event,
    warmups: Counter,
) -> None:
    """Until cancelled: every `period` seconds in which no decision ended (by
    `decided_at`, a perf_counter time), as long as one ended within `window` seconds,
    warm the policies in use that can be, each counted in `warmups` by its name.
    Past the window it waits for `decided`, which the gateway sets at every decision."""
    while True:
        policies = routes.warmable
        if not policies:
            await asyncio.sleep(IDLE_CHECK)
            continue
        await asyncio.sleep(period)
        idle = time.perf_counter() - decided_at()
        if idle > window:
            decided.clear()  # no await between the look and the wait: none is missed
            await decided.wait()
            continue
        if idle < period:
            continue
        try:
            for policy in policies:
                if policy.warm():
                    series(warmups, policy.name).inc()
        except Exception:
            # a fault of the policy's, which its next real decision will meet too
            log.exception("keeping the decision warm failed; it stops until restart")
            return
