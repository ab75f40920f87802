"""The QoS decision after the core has idled (with and without warm-ups) or its caches
were evicted.

`edgeroute bench idle`, in two parts. In a loop: `qos_drl` on 12 experts with full
queues (the views of `bench policies`), one decision after each idle gap of 0 to 20
ms, on one pinned core; without warm-ups the process sleeps through the gap, with them
it calls the policy's `warm` (what the gateway's `keep_warm_ms` calls) every
`KEEP_WARM_MS` of it; the timed decisions' percentiles per gap, medians over runs. Then
without a gap but with memory read between decisions (`TRAFFIC_MB`), as a request's
HTTP work between two decisions evicts the caches: how much of the request path's
slower decision the caches alone explain. On the request path: `bench overhead`'s
full-queue phase for `qos_drl` without and with `keep_warm_ms`, the two side by side
in each round (their order alternating), so that each round's pair saw the same
machine.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from edgeroute.bench.loadgen import percentile
from edgeroute.bench.overhead import GATEWAY_CPU, KEEP_WARM_MS, LOAD_CPU, full_queue_phase, pin
from edgeroute.bench.policies import MEDIAN_PROMPT, full_queues
from edgeroute.results_io import Plot, table, write
from policies import RequestInfo

GAPS_MS = (0.0, 1.0, 2.0, 5.0, 10.0, 20.0)
TRAFFIC_MB = (0.0, 0.5, 2.0, 8.0, 32.0)
BACKENDS = 12
QS = (("p50_us", 50), ("p90_us", 90), ("p99_us", 99))
TARGETS = ("qos_drl", "qos_drl@warm")


def idle(gap: float, warm_every: float | None, warm: Callable[[], object]) -> None:
    """Sleep `gap` seconds, calling `warm` every `warm_every` of them if given."""
    end = time.perf_counter() + gap
    while (left := end - time.perf_counter()) > 0:
        if warm_every is not None and left > warm_every:
            time.sleep(warm_every)
            warm()
        else:
            time.sleep(left)


def reader(megabytes: float) -> Callable[[], object]:
    """A call that reads `megabytes` of memory of its own (nothing for 0)."""
    if not megabytes:
        return lambda: None
    block = np.ones(int(megabytes * 2**20) // 8)
    return block.sum


def percentiles(
    reps: int, runs: int, before: Callable[[], object], decide: Callable[[int], object]
) -> dict[str, float]:
    """The decisions' percentiles (us), each run's `reps` decisions after `before`
    (untimed), medians over runs."""
    per_run: list[dict[str, float]] = []
    for _ in range(runs):
        times = []
        for k in range(reps):
            before()
            t0 = time.perf_counter()
            decide(k)
            times.append(time.perf_counter() - t0)
        per_run.append({q: percentile(times, p) * 1e6 for q, p in QS})
    return {q: round(statistics.median(r[q] for r in per_run), 1) for q, _ in QS}


def measure(reps: int, runs: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rows after idle gaps, then those after memory traffic."""
    from policies.qos_drl import QoSDRL

    policy = QoSDRL()
    views = full_queues(policy, BACKENDS)
    req = RequestInfo("m", 300, prompt=MEDIAN_PROMPT, now=1.0)

    def busy() -> None:  # the process and the core busy again: first calls, clock
        for view in views * 20:
            policy.decide(req, view)

    busy()

    def decide(k: int) -> object:
        return policy.decide(req, views[k % len(views)])

    rows = []
    for warm_every in (None, KEEP_WARM_MS / 1000):
        mode = "sleeps" if warm_every is None else f"warm every {KEEP_WARM_MS:g} ms"
        for gap in GAPS_MS:
            row = {
                "idle": mode,
                "gap_ms": gap,
                **percentiles(
                    reps, runs, functools.partial(idle, gap / 1000, warm_every, policy.warm), decide
                ),
            }
            rows.append(row)
            print(
                f"  {mode:<17} gap {gap:4g} ms: p50 {row['p50_us']:6.0f}  "
                f"p90 {row['p90_us']:6.0f}  p99 {row['p99_us']:6.0f} us",
                flush=True,
            )
    busy()  # after the gaps' sleeps, where the first row after them ran slow (2026-12-05)
    traffic = []
    for mb in TRAFFIC_MB:
        row = {"read_mb": mb, **percentiles(reps, runs, reader(mb), decide)}
        traffic.append(row)
        print(
            f"  reads {mb:4g} MB between: p50 {row['p50_us']:6.0f}  "
            f"p90 {row['p90_us']:6.0f}  p99 {row['p99_us']:6.0f} us",
            flush=True,
        )
    return rows, traffic


def request_path(rounds: int, seconds: float) -> list[dict[str, Any]]:
    """Each round's p99 and share of decisions over budget, without and with warm-ups."""
    pin(LOAD_CPU)
    plain, warm = full_queue_phase(rounds, seconds, list(TARGETS))
    rows = []
    for r in range(rounds):
        row: dict[str, Any] = {"round": r + 1}
        for name, got in (("plain", plain), ("warm", warm)):
            row[f"{name}_p99_us"] = got["rounds_decision_p99_us"][r]
            row[f"{name}_over_budget_pct"] = got["rounds_over_budget_pct"][r]
        rows.append(row)
    return rows


def main(quick: bool, seed: int, json_path: str | None) -> None:
    pin(GATEWAY_CPU)
    reps, runs, rounds = (40, 1, 1) if quick else (200, 3, 10)
    loop, traffic = measure(reps, runs)
    path = request_path(rounds, 2.0 if quick else 8.0)
    lower = sum(r["warm_p99_us"] < r["plain_p99_us"] for r in path)
    fewer = sum(r["warm_over_budget_pct"] < r["plain_over_budget_pct"] for r in path)
    summary = (
        "\n\n## After memory traffic\n\nNo gap; before each decision the process reads "
        "a buffer of its own of the size shown (untimed), evicting the caches as a "
        "request's HTTP work does between two decisions on the gateway's core.\n\n"
        + table(traffic, list(traffic[0]))
        + f"\n\n## On the request path\n\n`bench overhead`'s full-queue phase (N=12, 180 "
        f"clients, answers held 200 ms), `qos_drl` without and with `keep_warm_ms` = "
        f"{KEEP_WARM_MS:g}, side by side in each of {rounds} rounds: the warm gateway's "
        f"p99 was the lower in {lower} and its share of decisions over 300 us the "
        f"smaller in {fewer}. Medians over rounds: p99 "
        f"{statistics.median(r['plain_p99_us'] for r in path):.0f} against "
        f"{statistics.median(r['warm_p99_us'] for r in path):.0f} us, over budget "
        f"{statistics.median(r['plain_over_budget_pct'] for r in path):.2f}% against "
        f"{statistics.median(r['warm_over_budget_pct'] for r in path):.2f}%.\n\n"
        + table(path, list(path[0]))
    )
    print(summary)
    write(
        "decision_idle",
        {
            "command": "edgeroute bench idle" + (" --quick" if quick else ""),
            "reps": reps,
            "runs": runs,
            "rounds": rounds,
            "seed": seed,
            # the second part's rounds, here so that the rows stay one table's
            "request_path_results": path,
            "traffic_results": traffic,
        },
        loop,
        ["idle", "gap_ms", "p50_us", "p90_us", "p99_us"],
        json_path,
        quick=quick,
        plot=Plot(
            "gap_ms",
            ("p50_us", "p99_us"),
            ("idle",),
            "qos_drl decision (N=12, full queues) after an idle gap",
        ),
        notes=f"In a loop: one core (CPU {GATEWAY_CPU}), onnxruntime on one thread. Each "
        "decision follows an idle gap: the process sleeps through it, or calls the "
        "policy's `warm` (the gateway's `keep_warm_ms`) every period of it. Percentiles "
        f"of {reps} decisions per gap, medians over {runs} runs. The seed is not used: "
        "the inputs are fixed." + summary,
    )
