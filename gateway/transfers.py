"""KV transfers this replica has in flight, by prefill instance and network tier:
NetKV's self-contention count, fed to the snapshot, and the intents outbox that the
monitor publishes to the store for the other replicas and the oracle."""

from __future__ import annotations

from collections import deque
from typing import Any

from gateway.backends import BackendPool

INTENTS_KEPT = 10_000


class KVTransfers:
    def __init__(self, pool: BackendPool) -> None:
        self._pool = pool
        self.counts: dict[tuple[str, str], int] = {}
        self.intents: deque[dict[str, Any]] = deque(maxlen=INTENTS_KEPT)

    def started(self, prefill: str, tier: str, intent: dict[str, Any]) -> None:
        key = (prefill, tier)
        self.counts[key] = self.counts.get(key, 0) + 1
        self._pool.set_network(self._pool.oracle, self.counts)
        self.intents.append(intent)

    def finished(self, prefill: str, tier: str) -> None:
        key = (prefill, tier)
        left = self.counts.get(key, 0) - 1
        if left > 0:
            self.counts[key] = left
        else:
            self.counts.pop(key, None)
        self._pool.set_network(self._pool.oracle, self.counts)
