"""The gateway's own Prometheus metrics, all under the `edgeroute_` prefix.

Label values are model names, backend ids, statuses and policy names: never
request content, keys or tokens.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase

LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
ITL = (0.001, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.5)
OVERHEAD = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1)
# Fine below 10 us, where a decision on a small pool lands, and in 25 us steps over
# 100-500 us, where the learned policy's do (its budget is 300 us, a bucket bound, so
# the share of decisions over it is exact); coarse elsewhere.
DECISION = (
    0.000001,
    0.000002,
    0.000003,
    0.000004,
    0.000005,
    0.0000075,
    0.00001,
    0.000025,
    0.00005,
    *(round(k * 0.000025, 6) for k in range(4, 21)),
    0.00075,
    0.001,
    0.005,
)


@functools.lru_cache(maxsize=8192)
def series(metric: MetricWrapperBase, *values: str) -> Any:
    """`metric.labels(*values)`, remembered. labels() takes a lock and builds its key on
    every call, and the request path needs several series per request. (Label values
    are bounded: known models, configured backends, fixed reasons.)"""
    return metric.labels(*values)


class GatewayMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "edgeroute_requests",
            "Requests by model, endpoint (its path), backend and final status.",
            ["model", "endpoint", "backend", "status"],
            registry=r,
        )
        self.e2e = Histogram(
            "edgeroute_request_duration_seconds",
            "End-to-end latency seen by the gateway.",
            ["model", "backend"],
            buckets=LATENCY,
            registry=r,
        )
        self.ttft = Histogram(
            "edgeroute_time_to_first_token_seconds",
            "Time to the first streamed bytes.",
            ["model", "backend"],
            buckets=LATENCY,
            registry=r,
        )
        self.itl = Histogram(
            "edgeroute_inter_token_latency_seconds",
            "Gap between streamed chunks.",
            ["model", "backend"],
            buckets=ITL,
            registry=r,
        )
        self.overhead = Histogram(
            "edgeroute_gateway_overhead_seconds",
            "Time the gateway itself spends on a request (parse, route, relay set-up).",
            buckets=OVERHEAD,
            registry=r,
        )
        self.decision = Histogram(
            "edgeroute_policy_decision_seconds",
            "Time one routing decision takes.",
            ["policy"],
            buckets=DECISION,
            registry=r,
        )
        self.warmups = Counter(
            "edgeroute_policy_warmups",
            "Decisions repeated while idle to keep them warm (keep_warm_ms).",
            ["policy"],
            registry=r,
        )
        self.decisions = Counter(
            "edgeroute_policy_decisions",
            "Routing decisions by policy and chosen backend.",
            ["policy", "backend"],
            registry=r,
        )
        self.retries = Counter(
            "edgeroute_retries",
            "Attempts moved to another backend before the first byte.",
            ["backend", "reason"],
            registry=r,
        )
        self.output_tokens = Counter(
            "edgeroute_output_tokens",
            "Completion tokens relayed: the backend's usage when it sent one, else one "
            "per streamed data event.",
            ["model", "backend"],
            registry=r,
        )
        self.stalls = Counter(
            "edgeroute_backend_stalls",
            "Times a backend held requests without progress and had them moved.",
            ["backend"],
            registry=r,
        )
        self.client_aborts = Counter(
            "edgeroute_client_disconnects",
            "Clients that left before their request was answered, by phase.",
            ["phase"],
            registry=r,
        )
        self.shed = Counter(
            "edgeroute_shed_requests",
            "Requests refused for lack of capacity, by reason: the filter that left no "
            "backend (queue_cap, healthy, ...), qos (the QoS policy's drop) or "
            "max_inflight (the replica's limit).",
            ["model", "reason"],
            registry=r,
        )
        self.inflight = Gauge(
            "edgeroute_inflight_requests",
            "In-flight requests on each backend, all replicas.",
            ["backend"],
            registry=r,
        )
        self.local_inflight = Gauge(
            "edgeroute_replica_inflight_requests", "In-flight requests on this replica.", registry=r
        )
        self.backend_up = Gauge(
            "edgeroute_backend_healthy",
            "1 when the backend takes new requests.",
            ["backend"],
            registry=r,
        )
        self.circuit = Gauge(
            "edgeroute_backend_circuit_state",
            "0 closed, 1 half-open, 2 open.",
            ["backend"],
            registry=r,
        )
        self.backend_queue = Gauge(
            "edgeroute_backend_queue",
            "Engine running+waiting, as last scraped.",
            ["backend"],
            registry=r,
        )
        self.backend_kv = Gauge(
            "edgeroute_backend_kv_usage",
            "Engine KV-cache usage (0-1), as last scraped.",
            ["backend"],
            registry=r,
        )
        self.backend_token_latency = Gauge(
            "edgeroute_backend_token_latency_seconds",
            "Seconds per output token of each backend's recently answered requests, end "
            "to end, as the QoS policy sees it (0: none yet). It moves only when a "
            "request there ends: a backend the router has stopped using keeps its last.",
            ["backend"],
            registry=r,
        )
        self.stats_age = Gauge(
            "edgeroute_backend_stats_age_seconds",
            "Age of each backend's scraped stats.",
            ["backend"],
            registry=r,
        )
        self.store_up = Gauge("edgeroute_store_up", "1 while the shared store answers.", registry=r)
        self.store_age = Gauge(
            "edgeroute_telemetry_staleness_seconds",
            "Seconds since the shared-store snapshot was last refreshed.",
            registry=r,
        )
        self.oracle_rho = Gauge(
            "edgeroute_oracle_congestion",
            "Operator-reported congestion (rho) per tier.",
            ["tier"],
            registry=r,
        )
        self.oracle_age = Gauge(
            "edgeroute_oracle_age_seconds",
            "Seconds since the oracle was last updated (NaN: never).",
            registry=r,
        )
        self.oracle_age.set(math.nan)  # not 0, which would read as "just updated"
        self.oracle_tolerance = Gauge(
            "edgeroute_oracle_staleness_tolerance",
            "Proposition 2: congestion error that cannot invert adjacent tiers.",
            ["tiers"],
            registry=r,
        )
        self.self_contention = Gauge(
            "edgeroute_kv_transfers_inflight",
            "KV transfers in flight by prefill instance and tier (NetKV self-contention).",
            ["prefill", "tier"],
            registry=r,
        )
        self.pd_requests = Counter(
            "edgeroute_pd_requests",
            "Disaggregated requests by prefill, decode and tier.",
            ["prefill", "decode", "tier"],
            registry=r,
        )
        self.pd_ttft = Histogram(
            "edgeroute_pd_ttft_seconds",
            "TTFT of disaggregated requests (prefill, KV transfer, first decode step).",
            ["tier"],
            buckets=LATENCY,
            registry=r,
        )
        self.pd_decode_wait = Histogram(
            "edgeroute_pd_decode_wait_seconds",
            "From the decode request to its first bytes: KV transfer, queue and first step.",
            ["tier"],
            buckets=LATENCY,
            registry=r,
        )
        self.kv_estimate = Histogram(
            "edgeroute_kv_transfer_estimate_seconds",
            "The oracle's transfer-time estimate for each dispatched KV transfer.",
            ["tier"],
            buckets=LATENCY,
            registry=r,
        )
        self.replicas = Gauge(
            "edgeroute_replicas", "Gateway replicas seen in the shared store.", registry=r
        )
        self.expert_local = Gauge(
            "edgeroute_expert_local_ratio",
            "Share of a MoE backend's expert activations computed locally (Prism).",
            ["backend"],
            registry=r,
        )

        self.qos_requests = Counter(
            "edgeroute_qos_requests",
            "Requests the QoS policy handled, by outcome: met or missed its per-token "
            "latency target, failed, or shed.",
            ["outcome"],
            registry=r,
        )
        self.qos_score = Histogram(
            "edgeroute_qos_predicted_score",
            "Predicted response quality (0-1) on the backend the QoS policy chose.",
            ["backend"],
            buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
            registry=r,
        )
        self.qos_token_latency = Histogram(
            "edgeroute_qos_token_latency_seconds",
            "End-to-end time per output token of requests the QoS policy routed.",
            buckets=ITL,
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
