"""`edgeroute bench reload`: what a routing change costs the requests in flight.

Two emulated workers behind one gateway (the overhead benchmark's CPU split), one
client sending back to back. Each round measures it twice: with no change (the
baseline), then while an operator switches the default route between least_load and
qos_drl every `SWITCH_EVERY` seconds over the admin API. Every switch builds the new
policy (qos_drl loads two ONNX graphs) and every replica applies it; a gateway that
builds on its event loop holds every request in flight meanwhile. Medians over rounds.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import httpx

from edgeroute.bench.loadgen import Run, closed_loop, percentile, post
from edgeroute.bench.overhead import LOAD_CPU, emulated_pool, pin
from edgeroute.results_io import Plot, write

BODY = b'{"model":"mistral-7b-chat","messages":[{"role":"user","content":"hi"}],"max_tokens":4}'
TOKEN = "bench-reload-token"  # a throwaway gateway's admin token
SWITCH_EVERY = 0.5  # seconds between two routing changes
SPECS = ({"policy": "qos_drl"}, {"policy": "least_load"})


async def switching(port: int, seconds: float) -> tuple[Run, list[float]]:
    """The client's run while the route switches; and each switch's admin call time."""
    url = f"http://127.0.0.1:{port}/admin/routing/default"
    took: list[float] = []

    async def operator() -> None:
        async with httpx.AsyncClient(headers={"authorization": f"Bearer {TOKEN}"}) as c:
            for i in range(10**6):
                t = time.perf_counter()
                r = await c.put(url, json=SPECS[i % 2], timeout=30)
                r.raise_for_status()
                took.append(time.perf_counter() - t)
                await asyncio.sleep(SWITCH_EVERY)

    task = asyncio.create_task(operator())
    try:
        run = await closed_loop("127.0.0.1", port, post("/v1/chat/completions", BODY), 1, seconds)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return run, took


def figures(run: Run) -> dict[str, float]:
    ms = sorted(x * 1e3 for x in run.latencies)
    return {
        "requests": float(len(ms)),
        "p50_ms": percentile(ms, 50),
        "p99_ms": percentile(ms, 99),
        "p999_ms": percentile(ms, 99.9),
        "max_ms": ms[-1],
        "errors": float(run.errors),
    }


def main(quick: bool, seed: int, json_path: str | None) -> None:
    pin(LOAD_CPU)
    rounds, seconds = (1, 3.0) if quick else (3, 10.0)
    port = 18670
    samples: dict[str, list[dict[str, float]]] = {"quiet": [], "switching": []}
    with emulated_pool(2, port, ["--speedup", "1000"], "least_load", admin_token=TOKEN):
        for r in range(rounds):
            print(f"round {r + 1}/{rounds}: quiet", flush=True)
            quiet = asyncio.run(
                closed_loop("127.0.0.1", port, post("/v1/chat/completions", BODY), 1, seconds)
            )
            samples["quiet"].append(figures(quiet))
            print(f"round {r + 1}/{rounds}: switching", flush=True)
            run, took = asyncio.run(switching(port, seconds))
            row = figures(run)
            row["switches"] = float(len(took))
            row["switch_call_p50_ms"] = statistics.median(took) * 1e3 if took else 0.0
            samples["switching"].append(row)
            # The route ends on least_load for the next round's quiet phase.
            httpx.put(
                f"http://127.0.0.1:{port}/admin/routing/default",
                headers={"authorization": f"Bearer {TOKEN}"},
                json=SPECS[1],
                timeout=30,
            ).raise_for_status()
    rows: list[dict[str, Any]] = [
        {
            "phase": phase,
            **{k: round(statistics.median(s[k] for s in runs), 2) for k in runs[0]},
        }
        for phase, runs in samples.items()
    ]
    for row in rows:
        print(row, flush=True)
    write(
        "reload",
        {
            "command": "edgeroute bench reload" + (" --quick" if quick else ""),
            "rounds": rounds,
            "seconds": seconds,
            "seed": seed,
            "switch_every_s": SWITCH_EVERY,
        },
        rows,
        [
            "phase",
            "requests",
            "p50_ms",
            "p99_ms",
            "p999_ms",
            "max_ms",
            "switches",
            "switch_call_p50_ms",
            "errors",
        ],
        json_path,
        quick=quick,
        plot=Plot(
            "phase",
            ("p99_ms", "p999_ms", "max_ms"),
            title="One client's latency, quiet and while the route switches",
        ),
        notes="One client, two emulated workers (speedup 1000), the gateway on its own "
        "CPU. `switching`: the default route alternates between qos_drl and least_load "
        f"every {SWITCH_EVERY:g} s through `PUT /admin/routing/default`; "
        "`switch_call_p50_ms` is that call's time (the policy built and applied). Each "
        "figure is the median over rounds of that round's percentile.",
    )
