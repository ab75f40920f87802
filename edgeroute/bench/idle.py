"""The QoS decision after the core has idled, with and without warm-ups.

`edgeroute bench idle`, in two parts. In a loop: `qos_drl` on 12 experts with full
queues (the views of `bench policies`), one decision after each idle gap of 0 to 20
ms, on one pinned core; without warm-ups the process sleeps through the gap, with them
it calls the policy's `warm` (what the gateway's `keep_warm_ms` calls) every
`KEEP_WARM_MS` of it; the timed decisions' percentiles per gap, medians over runs. On
the request path: `bench overhead`'s full-queue phase for `qos_drl` without and with
`keep_warm_ms`, the two side by side in each round (their order alternating), so that
each round's pair saw the same machine.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from edgeroute.bench.loadgen import percentile
from edgeroute.bench.overhead import GATEWAY_CPU, KEEP_WARM_MS, LOAD_CPU, full_queue_phase, pin
from edgeroute.bench.policies import MEDIAN_PROMPT, full_queues
from edgeroute.results_io import Plot, table, write
from policies import RequestInfo

GAPS_MS = (0.0, 1.0, 2.0, 5.0, 10.0, 20.0)
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


def measure(reps: int, runs: int) -> list[dict[str, Any]]:
    from policies.qos_drl import QoSDRL

    policy = QoSDRL()
    views = full_queues(policy, BACKENDS)
    req = RequestInfo("m", 300, prompt=MEDIAN_PROMPT, now=1.0)
    for view in views * 20:  # warm the process itself: first calls, allocations
        policy.decide(req, view)
    rows = []
    for warm_every in (None, KEEP_WARM_MS / 1000):
        mode = "sleeps" if warm_every is None else f"warm every {KEEP_WARM_MS:g} ms"
        for gap in GAPS_MS:
            per_run: list[dict[str, float]] = []
            for _ in range(runs):
                times = []
                for k in range(reps):
                    idle(gap / 1000, warm_every, policy.warm)
                    t0 = time.perf_counter()
                    policy.decide(req, views[k % len(views)])
                    times.append(time.perf_counter() - t0)
                per_run.append({q: percentile(times, p) * 1e6 for q, p in QS})
            row = {
                "idle": mode,
                "gap_ms": gap,
                **{q: round(statistics.median(r[q] for r in per_run), 1) for q, _ in QS},
            }
            rows.append(row)
            print(
                f"  {mode:<17} gap {gap:4g} ms: p50 {row['p50_us']:6.0f}  "
                f"p90 {row['p90_us']:6.0f}  p99 {row['p99_us']:6.0f} us",
                flush=True,
            )
    return rows


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
    loop = measure(reps, runs)
    path = request_path(rounds, 2.0 if quick else 8.0)
    lower = sum(r["warm_p99_us"] < r["plain_p99_us"] for r in path)
    fewer = sum(r["warm_over_budget_pct"] < r["plain_over_budget_pct"] for r in path)
    summary = (
        f"\n\n## On the request path\n\n`bench overhead`'s full-queue phase (N=12, 180 "
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
