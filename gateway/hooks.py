"""Request lifecycle hooks: what happens around each attempt to send a request.

For every attempt on a backend the proxy calls each of the request's hooks:

- `dispatched(d)`: the backend was chosen and is about to be sent the request;
- `first_byte(d)`: its answer has begun (the status and the first bytes are in);
- `ended(d, outcome)`: the attempt is over. `outcome` is None when it failed before
  answering (the request moves on to the next backend of its ranking, or fails),
  else the response's status, output tokens and the time since the request arrived.

Hooks are for accounting around the request (metrics, counters, intents), never for
routing: a hook must not block, and must not fail. The gateway's own are QoS
accounting (every request) and NetKV's KV-transfer counting (disaggregated ones).
An installed package adds one through the entry-point group `edgeroute.hooks`, and
the config names it: `hooks: [{type: my_hook, params: {...}}]`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.backends import Backend
from gateway.metrics import GatewayMetrics, series
from gateway.transfers import KVTransfers
from oracle.topology import Topology
from policies.plugins import default_registry
from policies.types import Decision, RequestInfo


@dataclass(eq=False, slots=True)
class Dispatch:
    """One attempt: the request, what the policy decided, and the backend tried."""

    request: RequestInfo
    decision: Decision
    backend: Backend
    model: str
    rid: str


@dataclass(frozen=True, slots=True)
class Outcome:
    status: str  # the HTTP status sent, "499" when the client left
    tokens: int  # output tokens relayed
    elapsed: float  # seconds since the request arrived


class Hook(Protocol):
    def dispatched(self, d: Dispatch) -> None: ...

    def first_byte(self, d: Dispatch) -> None: ...

    def ended(self, d: Dispatch, outcome: Outcome | None) -> None: ...


def make_hook(type_name: str, params: Mapping[str, Any]) -> Hook:
    """The hook an installed package registered as `type_name` (PluginError if none)."""
    hook: Hook = default_registry().create("hook", type_name, params)
    return hook


class QoSAccounting:
    """The QoS router's figures: the predicted score of each routed request, and
    whether its per-token latency met the target it was routed for."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self.metrics = metrics

    def dispatched(self, d: Dispatch) -> None:
        if d.decision.predicted is not None:
            series(self.metrics.qos_score, d.backend.id).observe(d.decision.predicted[0])

    def first_byte(self, d: Dispatch) -> None:
        pass

    def ended(self, d: Dispatch, outcome: Outcome | None) -> None:
        target = d.decision.token_target
        if target is None or outcome is None or outcome.status == "499":
            return
        if outcome.status != "200" or outcome.tokens <= 0:
            series(self.metrics.qos_requests, "failed").inc()
            return
        per_token = outcome.elapsed / outcome.tokens
        self.metrics.qos_token_latency.observe(per_token)
        series(self.metrics.qos_requests, "met" if per_token <= target else "missed").inc()


class KVTransferCounting:
    """NetKV's self-contention for one disaggregated request: its KV transfer from
    `prefill` counts as in flight from the decode attempt's dispatch until the decode
    side answers (the cache has landed) or the attempt fails."""

    def __init__(
        self,
        transfers: KVTransfers,
        metrics: GatewayMetrics,
        oracle: Topology | None,
        prefill: Backend,
    ) -> None:
        self.transfers = transfers
        self.metrics = metrics
        self.oracle = oracle
        self.prefill = prefill
        self.tiers: dict[str, str] = {}  # decode backend -> its tier, as priced at dispatch
        self._in_flight: set[str] = set()

    def dispatched(self, d: Dispatch) -> None:
        decode, oracle = d.backend, self.oracle
        tier = oracle.tier(self.prefill.id, decode.id) if oracle is not None else "unknown"
        self.tiers[decode.id] = tier
        self._in_flight.add(decode.id)
        payload = d.request.prompt_tokens * decode.config.profile.kv_bytes_per_token
        estimate = (
            oracle.transfer_seconds(self.prefill.id, decode.id, payload)
            if oracle is not None
            else None
        )
        if estimate is not None:
            series(self.metrics.kv_estimate, tier).observe(estimate)
        intent: dict[str, Any] = {
            "ts": time.time(),
            "request_id": d.rid,
            "source": self.prefill.id,
            "destination": decode.id,
            "tier": tier,
            "payload_bytes": payload,
            "estimate_s": estimate,
            "priority": "interactive",
        }
        self.transfers.started(self.prefill.id, tier, intent)

    def first_byte(self, d: Dispatch) -> None:
        self._landed(d.backend)

    def ended(self, d: Dispatch, outcome: Outcome | None) -> None:
        self._landed(d.backend)

    def _landed(self, decode: Backend) -> None:
        if decode.id in self._in_flight:
            self._in_flight.discard(decode.id)
            self.transfers.finished(self.prefill.id, self.tiers[decode.id])
