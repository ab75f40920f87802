"""Before against after: what the gateway adds, measured from two checkouts in turn.

    edgeroute bench overhead-ab --before ../old-checkout --after . --pairs 10

Each side is measured by its own code: a child process started in that checkout
runs its fast backends and its gateway (least_load) as `edgeroute bench overhead`
does, and measures the direct path, c=1 latency and CPU per request at c=1 and c=32;
or, with `--phase qos-full-queues`, runs `bench overhead`'s full-queue phase for
`qos_drl` (12 backends that hold every answer) and reports the gateway's own decision
times.
Sides alternate within each pair, so a machine that slows down hurts both; the table
gives medians over pairs, and each pair's after/before ratio is kept in the JSON.
A checkout of either layout (the tools under `edgeroute/`, or the older top-level
`bench/`) can be either side.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from edgeroute.results_io import output_dir, save_figure, write

# Run inside a checkout (its directory first on sys.path); prints one JSON line.
_CHILD = """
import asyncio, json, os, subprocess, sys
sys.path.insert(0, os.getcwd())
if os.path.isdir("edgeroute"):
    from edgeroute.bench.overhead import MODELS, pin, start_gateway, wait_ready
    from edgeroute.bench.loadgen import closed_loop, cpu_seconds, percentile, post
    backend = "edgeroute.bench.fast_backend"
else:
    from bench.overhead import MODELS, pin, start_gateway, wait_ready
    from bench.loadgen import closed_loop, cpu_seconds, percentile, post
    backend = "bench.fast_backend"
seconds = float(sys.argv[1])
pin(0)
ports = (18731, 18732)
workers = [
    subprocess.Popen([sys.executable, "-m", backend, "--port", str(p), "--model", MODELS],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for p in ports
]
gw = None
try:
    for p in ports:
        wait_ready(f"http://127.0.0.1:{p}/health")
    gw = start_gateway(18730, [f"http://127.0.0.1:{p}" for p in ports], "least_load")
    body = b'{"model":"instant","messages":[{"role":"user","content":"hello"}],"max_tokens":16}'
    raw = post("/v1/chat/completions", body)
    asyncio.run(closed_loop("127.0.0.1", 18730, raw, 1, 1.0))  # warm-up
    direct = asyncio.run(closed_loop("127.0.0.1", ports[0], raw, 1, seconds))
    c0 = cpu_seconds(gw.pid)
    c1 = asyncio.run(closed_loop("127.0.0.1", 18730, raw, 1, seconds))
    c1_cpu = (cpu_seconds(gw.pid) - c0) / max(1, len(c1.latencies))
    c0 = cpu_seconds(gw.pid)
    c32 = asyncio.run(closed_loop("127.0.0.1", 18730, raw, 32, seconds))
    c32_cpu = (cpu_seconds(gw.pid) - c0) / max(1, len(c32.latencies))
    print(json.dumps({
        "direct_c1_p50_ms": percentile(direct.latencies, 50) * 1e3,
        "c1_p50_ms": percentile(c1.latencies, 50) * 1e3,
        "c1_cpu_us": c1_cpu * 1e6,
        "c32_rps": c32.rps,
        "c32_cpu_us": c32_cpu * 1e6,
        "errors": c1.errors + c32.errors,
    }))
finally:
    if gw is not None:
        gw.terminate()
        gw.wait(10)
    for w in workers:
        w.terminate()
        w.wait(10)
"""

# The QoS policy's decisions on the request path with full queues; the checkout's own
# phase (edgeroute layout only: the phase is younger than the move).
_QOS_CHILD = """
import json, os, sys
sys.path.insert(0, os.getcwd())
from edgeroute.bench.overhead import full_queue_phase
row = full_queue_phase(1, float(sys.argv[1]), ["qos_drl"])[0]
keys = ("decision_us", "decision_p50_us", "decision_p99_us", "over_budget_pct")
print(json.dumps({k: row[k] for k in keys}))
"""

# phase -> (child script, metrics)
PHASES = {
    "least-load": (_CHILD, ("added_c1_p50_ms", "c1_cpu_us", "c32_rps", "c32_cpu_us")),
    "qos-full-queues": (
        _QOS_CHILD,
        ("decision_us", "decision_p50_us", "decision_p99_us", "over_budget_pct"),
    ),
}


def measure(tree: Path, seconds: float, phase: str = "least-load") -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", PHASES[phase][0], str(seconds)],
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    sample: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    if "c1_p50_ms" in sample:
        sample["added_c1_p50_ms"] = sample["c1_p50_ms"] - sample["direct_c1_p50_ms"]
    return sample


def main(
    before: Path,
    after: Path,
    pairs: int,
    seconds: float,
    json_path: str | None,
    name: str,
    phase: str = "least-load",
) -> None:
    metrics = PHASES[phase][1]
    samples: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for i in range(pairs):
        # Alternate which side goes first, so neither always runs on a warmer machine.
        order = [("before", before), ("after", after)]
        if i % 2:
            order.reverse()
        for side, tree in order:
            print(f"pair {i + 1}/{pairs}: {side}", flush=True)
            samples[side].append(measure(tree, seconds, phase))
    rows: list[dict[str, Any]] = []
    for side in ("before", "after"):
        med = {k: statistics.median(s[k] for s in samples[side]) for k in metrics}
        rows.append({"side": side, **{k: round(v, 3) for k, v in med.items()}})
    ratios = {
        k: [round(a[k] / b[k], 3) for b, a in zip(samples["before"], samples["after"], strict=True)]
        for k in metrics
    }
    rows.append(
        {"side": "after / before (median of pair ratios)"}
        | {k: round(statistics.median(v), 3) for k, v in ratios.items()}
    )
    write(
        name,
        {
            "command": f"edgeroute bench overhead-ab --before {before} --after {after} "
            f"--pairs {pairs} --seconds {seconds} --name {name}"
            + (f" --phase {phase}" if phase != "least-load" else ""),
            "before": str(before),
            "after": str(after),
            "pairs": pairs,
            "seconds": seconds,
            "samples": samples,
            "pair_ratios": ratios,
        },
        rows,
        ["side", *metrics],
        json_path,
        notes="Medians over pairs; each side measured by its own checkout's code, "
        "alternating. c32_rps: higher is better; the others: lower is better."
        + (
            " Decision times from the gateway's histogram (25 us buckets from 100 to 500 us: "
            "the share over 300 us is exact, the percentiles interpolated)."
            if phase != "least-load"
            else ""
        ),
    )
    plot_ratios(ratios, output_dir(False) / f"{name}.png")


def plot_ratios(ratios: dict[str, list[float]], out: Path) -> None:
    """Each pair's after/before ratio per metric, with the median and the no-change line."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for i, values in enumerate(ratios.values()):
        ax.scatter([i] * len(values), values, alpha=0.6)
        ax.hlines(statistics.median(values), i - 0.25, i + 0.25, color="black")
    ax.axhline(1.0, color="grey", linestyle=":")
    ax.set_xticks(range(len(ratios)), list(ratios), fontsize=8)
    ax.set_ylabel("after / before, per pair")
    ax.set_title("Overhead A/B: each pair's ratio (bar: median)")
    fig.tight_layout()
    save_figure(fig, out, dpi=100)
    plt.close(fig)
