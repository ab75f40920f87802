"""vLLM's Prometheus metrics, current and older names, for one emulated worker.

Gauges and counters are read from the engine at scrape time; latency histograms
are observed as tokens are emitted. Times are emulated seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from workers.engine import Engine, Sequence

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
)
XFER_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


class _EngineCollector(Collector):
    def __init__(self, engine: Engine, model: str) -> None:
        self._engine = engine
        self._model = model

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        e, labels = self._engine, ["model_name"]
        st = e.stats
        gauges = {
            "vllm:num_requests_running": ("Requests in the running batch.", len(e.running)),
            "vllm:num_requests_waiting": ("Requests waiting to run.", len(e.waiting)),
            "vllm:kv_cache_usage_perc": ("KV-cache usage, 1 means 100 percent.", e.kv_usage),
            "vllm:gpu_cache_usage_perc": ("KV-cache usage (older name).", e.kv_usage),
            "vllm:gpu_prefix_cache_hit_rate": (
                "Prefix-cache hit rate (older name).",
                st.prefix_hits / st.prefix_queries if st.prefix_queries else 0.0,
            ),
            # The emulator's own: how far the host has run behind the engine's clock at
            # worst (emulated seconds); time-scaled benchmarks report it.
            "emulator:lag_max_seconds": (
                "Worst lag of the host behind the engine's clock.",
                st.lag_max,
            ),
        }
        for name, (doc, value) in gauges.items():
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric([self._model], value)
            yield g
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "KV cache configuration.",
            labels=["block_size", "num_gpu_blocks"],
        )
        info.add_metric([str(e.profile.block_size), str(e.profile.kv_blocks)], 1.0)
        yield info
        counters = {
            "vllm:prompt_tokens": ("Prefill tokens processed.", st.prompt_tokens),
            "vllm:generation_tokens": ("Generation tokens produced.", st.generation_tokens),
            "vllm:prefix_cache_queries": (
                "Prompt tokens looked up in the prefix cache.",
                st.prefix_queries,
            ),
            "vllm:prefix_cache_hits": ("Prompt tokens found in the prefix cache.", st.prefix_hits),
            "vllm:gpu_prefix_cache_queries": (
                "Prefix-cache queries (older name).",
                st.prefix_queries,
            ),
            "vllm:gpu_prefix_cache_hits": ("Prefix-cache hits (older name).", st.prefix_hits),
            "vllm:num_preemptions": ("Preemptions to free KV memory.", st.preemptions),
            "vllm:request_success": ("Requests finished.", st.finished),
        }
        for name, (doc, value) in counters.items():
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric([self._model], value)
            yield c


class _NetworkCollector(Collector):
    """The emulated network into this instance, per tier, as switch counters show it."""

    def __init__(self, counters: Callable[[], dict[str, tuple[float, float]]]) -> None:
        self._counters = counters

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        found = self._counters()
        background = GaugeMetricFamily(
            "emulator:link_background",
            "Background utilisation of the tier's link into this instance.",
            labels=["tier"],
        )
        busy = CounterMetricFamily(
            "emulator:link_busy_seconds",
            "Emulated seconds the tier's link into this instance carried KV transfers.",
            labels=["tier"],
        )
        for tier, (level, seconds) in found.items():
            background.add_metric([tier], level)
            busy.add_metric([tier], seconds)
        yield background
        yield busy


class WorkerMetrics:
    def __init__(
        self,
        engine: Engine,
        model: str,
        network: Callable[[], dict[str, tuple[float, float]]] | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(engine, model))
        if network is not None:
            self.registry.register(_NetworkCollector(network))
        self._model = model

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(
                name, doc, ["model_name"], buckets=buckets, registry=self.registry
            ).labels(model)

        self.ttft = hist("vllm:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.itl = hist("vllm:inter_token_latency_seconds", "Inter-token latency.", ITL_BUCKETS)
        self.tpot = hist(
            "vllm:time_per_output_token_seconds", "Time per output token (older name).", ITL_BUCKETS
        )
        self.e2e = hist(
            "vllm:e2e_request_latency_seconds", "End-to-end request latency.", E2E_BUCKETS
        )
        self.queue = hist("vllm:request_queue_time_seconds", "Time spent waiting.", E2E_BUCKETS)
        self.xfer_time = hist(
            "vllm:nixl_xfer_time_seconds", "KV transfer time into this instance.", XFER_BUCKETS
        )
        self.xfer_bytes = hist(
            "vllm:nixl_bytes_transferred",
            "Bytes per KV transfer.",
            tuple(float(4**i) * 1024 for i in range(12)),
        )

    def observe(self, event: str, seq: Sequence, now: float) -> None:
        """The engine's observer: called on first token, every later token, and finish."""
        if event == "first_token":
            self.ttft.observe(now - seq.arrival)
            if seq.admitted_at is not None:
                self.queue.observe(max(0.0, seq.admitted_at - seq.arrival))
        elif event == "token" and seq.last_token_at is not None:
            gap = now - seq.last_token_at
            self.itl.observe(gap)
            self.tpot.observe(gap)
        elif event == "finished":
            self.e2e.observe(now - seq.arrival)

    def render(self) -> bytes:
        return generate_latest(self.registry)
