"""vLLM's Prometheus metrics, current and older names, for one emulated worker.

Gauges and counters are read from the engine at scrape time; latency histograms
are observed as tokens are emitted. Times are emulated seconds.

The text is written here rather than by `prometheus_client`'s registry: its
exposition took 1.4-2.9 ms per scrape, and many workers share one event loop in a
time-scaled benchmark (`edgeroute bench qos --live` runs twelve), where every scrape
round stalled all the engines at once. The series, labels and text format are
`prometheus_client`'s (tests/workers/test_metrics.py holds them to it).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable

from prometheus_client import utils

from workers.engine import Engine, Sequence

# a number as the text format writes it (Go's formatting: `+Inf`, `1.048576e+06`)
_number: Callable[[float], str] = utils.floatToGoString

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


class Histogram:
    """One labelled histogram series: non-cumulative counts per bucket, rendered
    cumulative."""

    def __init__(self, name: str, doc: str, labels: str, buckets: tuple[float, ...]) -> None:
        self._bounds = buckets
        self._counts = [0] * (len(buckets) + 1)  # the last: above every bound (+Inf)
        self._sum = 0.0
        edges = [_number(b) for b in buckets] + ["+Inf"]
        sep = "," if labels else ""
        self._bucket_lines = [f'{name}_bucket{{le="{e}"{sep}{labels}}} ' for e in edges]
        self._head = f"# HELP {name} {doc}\n# TYPE {name} histogram\n"
        self._count_line = f"{name}_count{{{labels}}} "
        self._sum_line = f"{name}_sum{{{labels}}} "
        created = _number(time.time())
        self._tail = (
            f"# HELP {name}_created {doc}\n# TYPE {name}_created gauge\n"
            f"{name}_created{{{labels}}} {created}\n"
        )

    def observe(self, value: float) -> None:
        self._counts[bisect.bisect_left(self._bounds, value)] += 1
        self._sum += value

    def lines(self, out: list[str]) -> None:
        out.append(self._head)
        total = 0
        for line, n in zip(self._bucket_lines, self._counts, strict=True):
            total += n
            out.append(f"{line}{_number(total)}\n")
        out.append(f"{self._count_line}{_number(total)}\n")
        out.append(f"{self._sum_line}{_number(self._sum)}\n")
        out.append(self._tail)


def _family(
    out: list[str], name: str, doc: str, kind: str, samples: list[tuple[str, float]]
) -> None:
    """A gauge or counter family: `samples` are (labels, value); a counter's name takes
    `_total`, as `prometheus_client` writes it."""
    if kind == "counter":
        name += "_total"
    out.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n")
    for labels, value in samples:
        out.append(f"{name}{{{labels}}} {_number(value)}\n")


class WorkerMetrics:
    def __init__(
        self,
        engine: Engine,
        model: str,
        network: Callable[[], dict[str, tuple[float, float]]] | None = None,
    ) -> None:
        self._engine = engine
        self._network = network
        self._labels = f'model_name="{_escaped(model)}"'

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, self._labels, buckets)

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
        self._histograms = (
            self.ttft,
            self.itl,
            self.tpot,
            self.e2e,
            self.queue,
            self.xfer_time,
            self.xfer_bytes,
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
        e, st, own = self._engine, self._engine.stats, self._labels
        out: list[str] = []
        gauges = (
            ("vllm:num_requests_running", "Requests in the running batch.", len(e.running)),
            ("vllm:num_requests_waiting", "Requests waiting to run.", len(e.waiting)),
            ("vllm:kv_cache_usage_perc", "KV-cache usage, 1 means 100 percent.", e.kv_usage),
            ("vllm:gpu_cache_usage_perc", "KV-cache usage (older name).", e.kv_usage),
            (
                "vllm:gpu_prefix_cache_hit_rate",
                "Prefix-cache hit rate (older name).",
                st.prefix_hits / st.prefix_queries if st.prefix_queries else 0.0,
            ),
            # The emulator's own: how far the host has run behind the engine's clock at
            # worst (emulated seconds); time-scaled benchmarks report it.
            (
                "emulator:lag_max_seconds",
                "Worst lag of the host behind the engine's clock.",
                st.lag_max,
            ),
        )
        for name, doc, value in gauges:
            _family(out, name, doc, "gauge", [(own, value)])
        config = f'block_size="{e.profile.block_size}",num_gpu_blocks="{e.profile.kv_blocks}"'
        _family(out, "vllm:cache_config_info", "KV cache configuration.", "gauge", [(config, 1.0)])
        counters = (
            ("vllm:prompt_tokens", "Prefill tokens processed.", st.prompt_tokens),
            ("vllm:generation_tokens", "Generation tokens produced.", st.generation_tokens),
            (
                "vllm:prefix_cache_queries",
                "Prompt tokens looked up in the prefix cache.",
                st.prefix_queries,
            ),
            ("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.", st.prefix_hits),
            (
                "vllm:gpu_prefix_cache_queries",
                "Prefix-cache queries (older name).",
                st.prefix_queries,
            ),
            ("vllm:gpu_prefix_cache_hits", "Prefix-cache hits (older name).", st.prefix_hits),
            ("vllm:num_preemptions", "Preemptions to free KV memory.", st.preemptions),
            ("vllm:request_success", "Requests finished.", st.finished),
        )
        for name, doc, value in counters:
            _family(out, name, doc, "counter", [(own, value)])
        if self._network is not None:
            # the emulated network into this instance, per tier, as switch counters show it
            found = self._network()
            tiers = [(f'tier="{_escaped(t)}"', v) for t, v in found.items()]
            _family(
                out,
                "emulator:link_background",
                "Background utilisation of the tier's link into this instance.",
                "gauge",
                [(t, level) for t, (level, _) in tiers],
            )
            _family(
                out,
                "emulator:link_busy_seconds",
                "Emulated seconds the tier's link into this instance carried KV transfers.",
                "counter",
                [(t, seconds) for t, (_, seconds) in tiers],
            )
        for h in self._histograms:
            h.lines(out)
        return "".join(out).encode()


def _escaped(value: str) -> str:
    """A label value as the text format writes it."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
