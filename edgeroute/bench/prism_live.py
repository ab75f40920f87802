"""Prism through the gateway: `edgeroute bench prism --live`.

Four Mixtral workers in MoE mode (the `moe` pool of `bench live`: each hosts half of
every layer's experts, each expert on two workers) behind the gateway. GSM8K and
HumanEval requests replay Mixtral's recorded per-token expert selections. Traffic is
Poisson; its class mix shifts halfway (80% GSM8K, then 80% HumanEval), so a placement
made for the first half is wrong for the second.

Arms, a 2 x 2 of routing and placement:

- `prism`: the expert-map policy, and the gateway's Prism scheduler re-planning on its
  own schedule (every 120 emulated seconds, time-scaled with the workers) and
  moving experts only when eq. 4 says so;
- `prism, static`: the same policy, the initial placement kept;
- `least_load, migrating`: least-load routing with the scheduler on;
- `least_load, static`: least-load routing, the initial placement kept.

Per run: end-to-end latency and inter-token latency (emulated seconds), the local
compute ratio the workers counted, and how many times experts moved. Each seed is
one arrival sequence and class draw, the same for every arm; intervals are 95%,
paired by seed against `prism`.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from edgeroute.bench.live import Router, one, running, workers
from edgeroute.bench.live_pools import ADMIN_TOKEN, MODEL, POOLS
from edgeroute.bench.loadgen import until
from edgeroute.results_io import Plot, draw, output_dir, table, write
from edgeroute.stats import interval, shown

ARMS: dict[str, tuple[str, bool]] = {  # name -> (routing policy, scheduler on)
    "prism": ("prism", True),
    "prism, static": ("prism", False),
    "least_load, migrating": ("least_load", True),
    "least_load, static": ("least_load", False),
}
PROMPTS = {
    "gsm8k": "A farmer has 17 sheep and buys 5 more each week. How many after 6 weeks?",
    "humaneval": 'def running_max(xs: list[int]) -> list[int]:\n    """Prefix maxima."""',
}


@dataclass(frozen=True)
class LiveSettings:
    seeds: tuple[int, ...]
    seconds: float = 320.0  # emulated seconds of arrivals; the mix shifts halfway
    rate: float = 2.0  # requests per emulated second
    tokens: int = 48  # per answer
    speedup: float = 10.0
    replan: float = 120.0  # emulated seconds between the scheduler's plans
    data_dir: Path | None = None


def arrivals(s: LiveSettings, seed: int) -> list[tuple[float, str]]:
    """(emulated time, class): Poisson, 80/20 GSM8K/HumanEval, then the reverse."""
    rng = random.Random(seed)
    out = []
    t = rng.expovariate(s.rate)
    while t < s.seconds:
        first = t < s.seconds / 2
        gsm = rng.random() < (0.8 if first else 0.2)
        out.append((t, "gsm8k" if gsm else "humaneval"))
        t += rng.expovariate(s.rate)
    return out


def body(task: str, tokens: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPTS[task]}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "metadata": {"task": task},
    }


async def send_all(
    url: str, s: LiveSettings, plan: list[tuple[float, str]]
) -> tuple[list[Any], list[dict[str, Any]]]:
    """The requests' results, and every plan the scheduler made meanwhile (polled)."""
    limits = httpx.Limits(max_connections=None)
    timeout = httpx.Timeout(600.0, connect=10.0)
    decisions: dict[float, dict[str, Any]] = {}
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
        start = time.perf_counter()

        async def at(t: float, task: str) -> Any:
            await until(start + t / s.speedup)
            headers = {"x-edgeroute-task": task}
            return await one(client, url, body(task, s.tokens), s.speedup, True, headers)

        async def watch() -> None:
            auth = {"authorization": f"Bearer {ADMIN_TOKEN}"}
            while True:
                r = await client.get(url + "/admin/prism", headers=auth)
                candidate = r.json().get("candidate")
                if candidate:
                    decisions[candidate["at"]] = candidate
                await asyncio.sleep(0.5)

        watcher = asyncio.create_task(watch())
        try:
            results = await asyncio.gather(*(at(t, task) for t, task in plan))
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
    return list(results), [decisions[k] for k in sorted(decisions)]


def run_one(s: LiveSettings, arm: str, seed: int) -> dict[str, Any]:
    policy, migrating = ARMS[arm]
    # Static arms keep their placement: the scheduler's period is longer than the run.
    period = s.replan / s.speedup if migrating else 1e9  # the gateway's clock is the wall
    extra = {"prism_replan_seconds": period, "admin_token": ADMIN_TOKEN}
    pool = replace(POOLS["moe"], extra_settings=extra)
    router = Router(arm, "edgeroute", {"policy": policy}, frozenset({"moe"}))
    plan = arrivals(s, seed)
    with (
        workers(pool, s.speedup, s.data_dir, seed) as urls,
        running(router, pool, urls) as (url, _),
    ):
        results, decisions = asyncio.run(send_all(url, s, plan))
        stats = [httpx.get(u + "/moe/stats", timeout=10).json() for u in urls]
    ok = [r for r in results if r.status == "ok"]
    local = sum(st["local_calls"] for st in stats)
    calls = local + sum(st["remote_calls"] for st in stats)
    half = s.seconds / 2
    late = [r for (t, _), r in zip(plan, results, strict=True) if t >= half and r.status == "ok"]
    return {
        "arm": arm,
        "seed": seed,
        "requests": len(results),
        "failed": len(results) - len(ok),
        "e2e_s": statistics.fmean(r.e2e for r in ok) if ok else math.nan,
        "e2e_after_shift_s": statistics.fmean(r.e2e for r in late) if late else math.nan,
        "itl_ms": statistics.fmean(r.itl for r in ok) * 1e3 if ok else math.nan,
        "local_ratio": local / calls if calls else math.nan,
        "migrations": sum(int(st["migrations"]) for st in stats),
        "plans": len(decisions),
        "adopted": sum(bool(d["adopted"]) for d in decisions),
        "decisions": [
            {k: d[k] for k in ("current_cost_s", "expected_cost_s", "migration_s", "reason")}
            for d in decisions
        ],
    }


METRICS = ("e2e_s", "e2e_after_shift_s", "itl_ms", "local_ratio", "plans", "adopted")


def main(s: LiveSettings, json_path: str | None, quick: bool) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    total = len(s.seeds) * len(ARMS)
    for seed in s.seeds:
        for arm in ARMS:
            row = run_one(s, arm, seed)
            rows.append(row)
            print(
                f"[{len(rows)}/{total}] seed {seed} {arm}: e2e {row['e2e_s']:.2f} s, "
                f"local {row['local_ratio']:.3f}, plans {row['plans']} "
                f"(adopted {row['adopted']}), "
                f"failed {row['failed']}",
                file=sys.stderr,
                flush=True,
            )
    summary = []
    for arm in ARMS:
        mine = [r for r in rows if r["arm"] == arm]
        summary.append(
            {
                "arm": arm,
                "seeds": len(mine),
                "requests": sum(r["requests"] for r in mine),
                "failed": sum(r["failed"] for r in mine),
                **{m: shown([r[m] for r in mine]) for m in METRICS},
            }
        )
    paired = []
    for arm in ARMS:
        if arm == "prism":
            continue
        entry: dict[str, Any] = {"against": arm}
        for m in ("e2e_s", "e2e_after_shift_s", "local_ratio"):
            by_seed = {r["seed"]: r[m] for r in rows if r["arm"] == arm}
            diffs = [r[m] - by_seed[r["seed"]] for r in rows if r["arm"] == "prism"]
            entry[f"prism - it: {m}"] = shown(diffs)
            entry[f"{m}_mean"] = interval(diffs)[0]
        paired.append(entry)
    notes = (
        f"{len(s.seeds)} seeds; {s.seconds:.0f} emulated s of Poisson arrivals at "
        f"{s.rate}/s, {s.tokens} tokens each, speedup {s.speedup}; the class mix shifts "
        f"at {s.seconds / 2:.0f} s (80% GSM8K, then 80% HumanEval); the scheduler "
        f"re-plans every {s.replan:.0f} emulated s ({s.replan / s.speedup:.1f} wall s) in "
        "the migrating arms. Expert selections: Mixtral's recorded tokens, replayed.\n\n"
        "## Paired by seed: prism minus each other arm (mean ± 95% half-width)\n\n"
        + table(
            paired,
            [
                "against",
                "prism - it: e2e_s",
                "prism - it: e2e_after_shift_s",
                "prism - it: local_ratio",
            ],
        )
    )
    write(
        "prism_live",
        {
            "command": "edgeroute bench prism --live" + (" --quick" if quick else ""),
            "settings": {k: str(v) for k, v in vars(s).items()},
        },
        rows,
        ["arm", "seeds", "requests", "failed", *METRICS],
        json_path,
        notes=notes,
        quick=quick,
        table_rows=summary,
    )
    draw(
        Plot(
            "seed",
            ("e2e_s", "local_ratio"),
            ("arm",),
            title="Prism live: per seed, by arm",
        ),
        rows,
        output_dir(quick) / "prism_live.png",
    )
    print("\n" + table(summary, ["arm", "requests", "failed", *METRICS]) + "\n\n" + notes)
    return rows
