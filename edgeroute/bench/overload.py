"""`edgeroute bench overload`: goodput and shedding as offered load passes capacity.

Two emulated workers (mistral-7b-chat's timing, sped up) behind one gateway whose
in-flight limit is the pool's capacity. Closed-loop clients (which retry a shed
request at once, the harshest client) offer from a quarter of that capacity to four
times it. For each level: goodput (200s per second), sheds (429s per second, each
with Retry-After), the latency of admitted requests, and the gateway's memory.
"""

from __future__ import annotations

import asyncio
import statistics
from pathlib import Path
from typing import Any

from edgeroute.bench.loadgen import closed_loop, percentile, post
from edgeroute.bench.overhead import LOAD_CPU, emulated_pool, pin
from edgeroute.results_io import output_dir, save_figure, write

CAPACITY = 16  # the gateway's max_inflight: what the two workers run without queueing
BODY = b'{"model":"mistral-7b-chat","messages":[{"role":"user","content":"hi"}],"max_tokens":16}'


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def plot(rows: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["offered_concurrency"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    a.plot(x, [r["goodput_rps"] for r in rows], "o-", label="goodput (200/s)")
    a.plot(x, [r["shed_rps"] for r in rows], "s-", label="shed (429/s)")
    a.axvline(CAPACITY, color="grey", linestyle=":", label="in-flight limit")
    a.set_xscale("log", base=2)
    a.set_yscale("symlog", linthresh=100)
    a.set_xlabel("closed-loop clients")
    a.set_ylabel("responses per second")
    a.legend(fontsize=8)
    b.plot(x, [r["admitted_p50_ms"] for r in rows], "o-", label="admitted p50")
    b.plot(x, [r["admitted_p99_ms"] for r in rows], "s-", label="admitted p99")
    b.axvline(CAPACITY, color="grey", linestyle=":")
    b.set_xscale("log", base=2)
    b.set_xlabel("closed-loop clients")
    b.set_ylabel("ms")
    b.legend(fontsize=8)
    fig.suptitle("Overload: the excess is shed at once; goodput and admitted latency")
    fig.tight_layout()
    save_figure(fig, out, dpi=100)
    plt.close(fig)


def main(quick: bool, json_path: str | None) -> None:
    pin(LOAD_CPU)
    levels = [8, 32] if quick else [4, 8, 16, 32, 64]
    seconds = 2.0 if quick else 8.0
    port = 18650
    rows: list[dict[str, Any]] = []
    with emulated_pool(2, port, ["--speedup", "10"], "least_load", max_inflight=CAPACITY) as gw:
        raw = post("/v1/chat/completions", BODY)
        for c in levels:
            run = asyncio.run(closed_loop("127.0.0.1", port, raw, c, seconds))
            other = sum(n for s, n in run.statuses.items() if s not in (200, 429))
            rows.append(
                {
                    "offered_concurrency": c,
                    "goodput_rps": round(run.statuses[200] / run.seconds, 1),
                    "shed_rps": round(run.statuses[429] / run.seconds, 1),
                    "other_statuses": other,
                    "admitted_p50_ms": round(percentile(run.latencies, 50) * 1e3, 1),
                    "admitted_p99_ms": round(percentile(run.latencies, 99) * 1e3, 1),
                    "gateway_rss_mb": round(rss_mb(gw.pid), 1),
                }
            )
            print(rows[-1], flush=True)
    below = [r["admitted_p50_ms"] for r in rows if r["offered_concurrency"] <= CAPACITY]
    notes = (
        f"In-flight limit {CAPACITY}; closed-loop clients retry a 429 at once. "
        f"Median admitted p50 at or below the limit: {statistics.median(below):.1f} ms. "
        "`other_statuses` counts anything but 200 and 429 (a lost or failed request)."
    )
    write(
        "overload",
        {
            "command": "edgeroute bench overload" + (" --quick" if quick else ""),
            "seconds": seconds,
            "capacity": CAPACITY,
        },
        rows,
        list(rows[0]),
        json_path,
        quick=quick,
        notes=notes + "\n\n![goodput and latency against offered load](overload.png)",
    )
    plot(rows, output_dir(quick) / "overload.png")
