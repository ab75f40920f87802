"""Decision time of every policy for 8, 64 and 512 backends.

`edgeroute bench policies`: each policy decides on a realistic snapshot (random
loads, prefix caches, a 2k-token prompt with its block hashes) many times; the
figure is the median over runs of the per-decision mean, plus the p99 of the
individual timings of the last run. Decode-selection policies (NetKV and its
baselines) decide over decode instances spread on a fat-tree, with an oracle.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from edgeroute.bench.loadgen import percentile
from edgeroute.results_io import Plot, write
from oracle.topology import Topology
from policies import PRESETS, BackendView, ClusterView, PipelineSpec, RequestInfo, build_pipeline
from policies.text import block_hashes, estimate_tokens, stable_hash
from policies.types import InflightRequest

if TYPE_CHECKING:
    from policies.qos_drl import QoSDRL


def make_view(
    n: int, rng: random.Random, blocks: tuple[int, ...], decode: bool = False
) -> ClusterView:
    backends = []
    labels = {}
    for i in range(n):
        labels[f"b{i}"] = {"node": f"n{i // 2}", "rack": f"r{i // 8}", "pod": f"p{i // 32}"}
        cached = (
            frozenset(blocks[: rng.randrange(len(blocks) + 1)])
            if rng.random() < 0.3
            else (frozenset())
        )
        backends.append(
            BackendView(
                id=f"b{i}",
                url=f"http://10.0.0.{i % 250}:8000",
                models=frozenset({"m"}),
                running=rng.randrange(20),
                waiting=rng.randrange(5),
                kv_usage=rng.random(),
                stats_age=0.5,
                inflight=rng.randrange(30),
                cached_blocks=cached,
                id_hash=stable_hash(f"b{i}"),
                role="decode" if decode else "both",
                kv_capacity_tokens=200_000,
            )
        )
    labels["prefill"] = {"node": "nP", "rack": "r0", "pod": "p0"}
    oracle = Topology(instances=labels, congestion={"pod": 0.3, "cluster": 0.5})
    contention = MappingProxyType({("prefill", "rack"): 2, ("prefill", "pod"): 1})
    return ClusterView(tuple(backends), stale_after=5.0, oracle=oracle, self_contention=contention)


def measure(policy: str, n: int, calls: int, runs: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    text = "".join(rng.choice("abcdefgh ") for _ in range(8000))
    blocks = block_hashes(text, 64)
    decode = "decode_role" in PRESETS[policy].filters
    view = make_view(n, rng, blocks, decode)
    pipeline = build_pipeline(PipelineSpec(policy=policy))
    reqs = [
        RequestInfo(
            model="m",
            prompt_tokens=2000,
            block_hashes=blocks,
            seq=i,
            entropy=rng.getrandbits(63),
            session_hash=rng.getrandbits(63),
            prefill_id="prefill" if decode else None,
        )
        for i in range(calls)
    ]
    # A benchmark of rejections would measure nothing: every decision must pick.
    assert all(not pipeline.decide(r, view).rejected for r in reqs[:10]), policy
    return {"policy": policy, "backends": n, **timed(pipeline.decide, reqs, view, runs)}


def timed(
    decide: Callable[[RequestInfo, ClusterView], object],
    reqs: Sequence[RequestInfo],
    view: ClusterView | Sequence[ClusterView],
    runs: int,
) -> dict[str, float]:
    """Every request decided `runs` times: the median over runs of the per-decision
    mean, and the p50 and p99 of the last run's individual timings. Given several
    views, the decisions take them in turn."""
    views = [view] if isinstance(view, ClusterView) else list(view)
    means = []
    samples: list[float] = []
    for _ in range(runs):
        samples = []
        t_run = time.perf_counter()
        for i, r in enumerate(reqs):
            v = views[i % len(views)]
            t0 = time.perf_counter()
            decide(r, v)
            samples.append(time.perf_counter() - t0)
        means.append((time.perf_counter() - t_run) / len(reqs))
    return {
        "decision_us_mean": statistics.median(means) * 1e6,
        "decision_us_p50": percentile(samples, 50) * 1e6,
        "decision_us_p99": percentile(samples, 99) * 1e6,
    }


# As long as the median prompt of the QoS evaluation split (81 characters).
MEDIAN_PROMPT = "Write a python function to count the pairs in a list whose sum equals a target."


# A long-context prompt (about 8,000 tokens), of which the predictor reads 128 words.
LONG_PROMPT = " ".join([MEDIAN_PROMPT] * 400)


def measure_qos_drl(
    n: int, calls: int, runs: int, policy: QoSDRL | None = None, prompt: str = MEDIAN_PROMPT
) -> dict[str, Any]:
    """`qos_drl` on N experts with full queues (`full_queues`): the predictor, the
    features and the actor, as on the request path."""
    from policies.qos_drl import QoSDRL

    policy = policy or QoSDRL()
    req = RequestInfo("m", estimate_tokens(prompt), prompt=prompt, now=1.0)
    return {
        "policy": "qos_drl (full queues"
        + ("" if prompt == MEDIAN_PROMPT else f", {len(prompt):,}-character prompt")
        + ")",
        "backends": n,
        **timed(policy.decide, [req] * calls, full_queues(policy, n), runs),
    }


def full_queues(policy: QoSDRL, n: int) -> list[ClusterView]:
    """Views of N experts with full queues (5 running + 5 waiting each). The experts
    serve the predictor's models in turn, as in the QoS simulator (the graph predicts
    every model it knows per request: 7 for the default's). Each view differs from the
    one before in one backend's progress, as the gateway rebuilds the one it dispatched
    to, and by `with_load` as it does: the health and configuration stay, and so do the
    filters' verdicts on them."""
    experts = policy.predictor.models

    def requests(generated: int) -> tuple[InflightRequest, ...]:
        return tuple(InflightRequest(200, 0.0, generated, 0.5, 150.0) for _ in range(10))

    first = ClusterView(
        tuple(
            BackendView(
                id=f"e{i}",
                models=frozenset({"m"}),
                expert=experts[i % len(experts)],
                running=5,
                waiting=5,
                kv_usage=0.6,
                kv_capacity_tokens=4096,
                stats_age=0.0,
                inflight=10,
                requests=requests(40),
            )
            for i in range(n)
        )
    )
    variants = [(b, b.with_load(10, requests(41))) for b in first.backends]
    current = list(first.backends)
    views = []
    for j in range(2 * n):  # each backend on by one token, then back: a cycle
        current[j % n] = variants[j % n][(j // n + 1) % 2]
        views.append(first.with_load(tuple(current)))
    return views


def main(quick: bool, seed: int, json_path: str | None) -> None:
    sizes = (8, 64, 512)
    calls, runs = (300, 3) if quick else (3000, 5)
    rows = []
    for policy in PRESETS:
        for n in sizes:
            row = measure(policy, n, calls if n < 512 else calls // 3, runs, seed)
            rows.append(row)
            print(f"  {policy:<17} {n:>4} backends: {row['decision_us_mean']:8.1f} us", flush=True)
    # the QoS paper's sizes (the actor reads every in-flight request), and a long prompt
    for n, prompt in ((6, MEDIAN_PROMPT), (12, MEDIAN_PROMPT), (12, LONG_PROMPT)):
        row = measure_qos_drl(n, calls, runs, prompt=prompt)
        rows.append(row)
        print(
            f"  {row['policy']:<17} {n:>4} backends: {row['decision_us_mean']:8.1f} us "
            f"(p99 {row['decision_us_p99']:.0f})",
            flush=True,
        )
    write(
        "policies",
        {
            "command": "edgeroute bench policies",
            "sizes": sizes,
            "calls": calls,
            "runs": runs,
            "seed": seed,
        },
        rows,
        ["policy", "backends", "decision_us_mean", "decision_us_p50", "decision_us_p99"],
        json_path,
        quick=quick,
        plot=Plot(
            "backends",
            ("decision_us_p50", "decision_us_p99"),
            ("policy",),
            "Decision time per policy against the number of backends",
            log_x=True,
            log_y=True,
        ),
        notes="Pure Python, one core. The request carries a 2,000-token prompt (31 blocks "
        "of 64 tokens); 30% of backends hold a random-length prefix of it. `qos_drl` "
        "(onnxruntime, one thread) decides over 6 and 12 experts, each with 5 running "
        "and 5 waiting requests, features and predictor included, for a prompt of the "
        "QoS evaluation split's median length and, at 12, one of about 8,000 tokens.",
    )
