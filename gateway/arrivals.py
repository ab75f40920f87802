"""Each model's requests arriving per second at the gateway, all replicas together.

A replica counts the requests it receives (`policies.qos_state.Arrivals`, one per
model) and, at every shared-store sync, publishes its rates and reads the sum of the
other replicas'. A request's `RequestInfo.arrival_rate` is the two added: behind a
load balancer that spreads clients over R replicas, each sees about 1/R of them, and
an actor trained on the whole fleet's rate would otherwise read a load R times lighter.
Only rates cross the store, not clocks, so replicas on other hosts need no common time.
A replica counts only for models whose policy reads the rate (`Need.ARRIVAL_RATE`); the
routing lives in the shared store, so every replica counts for the same models.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from policies.qos_state import Arrivals

# Models whose arrivals are counted; past this many (names are the clients', though a
# route must exist for each) the counts start over rather than grow without end.
ARRIVALS_CAP = 1024

# A rate below this is not published: a model whose traffic stopped leaves the store.
QUIET = 1e-3


class ArrivalCounts:
    """This replica's arrivals per model, and the other replicas' rates (`remote`)."""

    def __init__(self, cap: int = ARRIVALS_CAP) -> None:
        self.cap = cap
        self._local: dict[str, Arrivals] = {}
        self.remote: dict[str, float] = {}

    def arrived(self, model: str, now: float) -> float:
        """Count a request of `model` at `now` (time.monotonic()); the model's rate at
        the gateway: this replica's, read after the arrival, and the others'."""
        arrivals = self._local.get(model)
        if arrivals is None and len(self._local) >= self.cap:
            self._local.clear()
        arrivals = self._local[model] = (arrivals or Arrivals()).arrived(now)
        return arrivals.rate() + self.remote.get(model, 0.0)

    def local_rates(self, now: float) -> dict[str, float]:
        """This replica's rate per model as of `now`, for the other replicas."""
        rates = {m: a.rate_at(now) for m, a in self._local.items()}
        return {m: r for m, r in rates.items() if r >= QUIET}

    def describe(self, now: float) -> dict[str, dict[str, float]]:
        """Per model with traffic: the arrivals per second this replica counted (`here`,
        as it publishes them) and those the others did (`others`), for operators."""
        here = self.local_rates(now)
        return {
            m: {"here": round(here.get(m, 0.0), 4), "others": round(self.remote.get(m, 0.0), 4)}
            for m in sorted(here.keys() | self.remote.keys())
        }

    def heard(self, remote: Mapping[str, float]) -> None:
        """The other replicas' rates, summed per model, from the latest sync. The store
        has left out what no peer could mean (`gateway.store._SYNC`); a rate that is
        still not finite and positive counts as none."""
        self.remote = {
            m: r for m, r in remote.items() if isinstance(r, float) and math.isfinite(r) and r > 0
        }
