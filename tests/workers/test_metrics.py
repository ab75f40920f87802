"""The worker's `/metrics` text, held to `prometheus_client`'s own exposition."""

from __future__ import annotations

import random
import re

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from workers.engine import Engine
from workers.metrics import ITL_BUCKETS, TTFT_BUCKETS, WorkerMetrics
from workers.profiles import PROFILES

MODEL = "mistral-7b-chat"


def _without_created(text: str) -> list[str]:
    """The lines of Prometheus text, the histograms' creation times blanked (they are
    clocks read when each side built its histogram)."""
    return re.sub(r"(_created\{[^}]*\}) \S+", r"\1 T", text).splitlines()


def test_histograms_are_written_as_prometheus_client_writes_them() -> None:
    metrics = WorkerMetrics(Engine(PROFILES[MODEL]), MODEL)
    registry = CollectorRegistry()
    reference = {
        name: Histogram(name, doc, ["model_name"], buckets=buckets, registry=registry).labels(MODEL)
        for name, doc, buckets in (
            ("vllm:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS),
            ("vllm:inter_token_latency_seconds", "Inter-token latency.", ITL_BUCKETS),
        )
    }
    rng = random.Random(7)
    # on the bounds, between them, above the last, and 0: every bucket's edge case
    values = [*TTFT_BUCKETS, *ITL_BUCKETS, 0.0, 1e9] + [rng.expovariate(20) for _ in range(3000)]
    for v in values:
        metrics.ttft.observe(v)
        reference["vllm:time_to_first_token_seconds"].observe(v)
    for v in values[::3]:
        metrics.itl.observe(v)
        reference["vllm:inter_token_latency_seconds"].observe(v)
    ours = _without_created(metrics.render().decode())
    theirs = _without_created(generate_latest(registry).decode())
    start = ours.index(theirs[0])
    assert ours[start : start + len(theirs)] == theirs


def test_engine_figures_and_odd_label_values_parse_back() -> None:
    engine = Engine(PROFILES[MODEL])
    engine.stats.generation_tokens = 1_234_567  # large enough for the exponent form
    engine.stats.prefix_queries, engine.stats.prefix_hits = 10, 4
    odd = 'a "quoted" \\ name\nwith a newline'
    tiers = {"rack": (0.25, 1.5), 'sp"ine': (0.5, 2.0)}
    text = WorkerMetrics(engine, odd, lambda: tiers).render().decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    own = (("model_name", odd),)
    assert samples[("vllm:generation_tokens_total", own)] == 1_234_567
    assert samples[("vllm:gpu_prefix_cache_hit_rate", own)] == 0.4
    assert samples[("vllm:num_requests_running", own)] == 0
    assert samples[("emulator:link_background", (("tier", 'sp"ine'),))] == 0.5
    assert samples[("emulator:link_busy_seconds_total", (("tier", "rack"),))] == 1.5
    assert samples[("vllm:time_to_first_token_seconds_count", own)] == 0
