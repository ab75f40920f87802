"""Live QoS runs of one setting pooled into one verdict over all their seeds.

A declared run of 10 or 20 seeds may be followed by more of the same setting; the
verdict is then taken on every seed together. Pooling here, rather than by hand, keeps
the arithmetic the one `bench qos --live` does (`qos_live.summarise`) and refuses runs
that are not of one setting: other engines, load, target, speed or quality world,
other models behind a policy's name, or a seed in two runs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from edgeroute.bench.qos_live import COLUMNS, served_run, summarise
from edgeroute.results_io import write
from workers.profiles import EXPERTS

# What makes two live runs one setting, besides the quality world and the models.
SETTING = (
    "requests_per_seed",
    "rate",
    "speedup",
    "latency_ms",
    "scrape_ms",
    "max_batch",
    "arrivals",  # none before the client paced its sends (`qos_live.ARRIVALS`)
)


class NotPoolable(ValueError):
    """The runs differ in something other than their seeds."""


def quality_of(command: str) -> str:
    """The quality world a run's recorded command names (`bench qos`'s default without)."""
    found = re.search(r"--quality (\S+)", command)
    return found.group(1) if found else "routerbench"


def _setting(config: dict[str, Any]) -> dict[str, Any]:
    # runs from before `engines` was recorded ran qos_live's default, one per expert
    return {
        **{k: config.get(k) for k in SETTING},
        "engines": config.get("engines") or len(EXPERTS),
        "quality": quality_of(config.get("command", "")),
    }


def _per_seed(config: dict[str, Any], row: dict[str, Any]) -> list[dict[str, Any]]:
    """A summary row back to the per-seed rows `summarise` takes. Latency and errors are
    kept only as a run's mean and total, so each seed carries the run's mean latency
    and the first seed its errors: the pooled mean and total come out exact. Each seed
    keeps the training run that served it, as recorded or, for runs recorded before
    that, as `qos_live.served_run` assigns it."""
    seeds = config["seeds"]
    runs = len(config["models"].get(row["policy"], []))
    recorded = row.get("per_seed_run") or [
        served_run(k, runs) if runs else None for k in range(len(seeds))
    ]
    return [
        {
            "seed": seed,
            "policy": row["policy"],
            "qos": row["per_seed_qos"][k],
            "met_share": row["per_seed_met_share"][k],
            "drop_rate": row["per_seed_drop_rate"][k],
            "busiest_share": row["per_seed_busiest_share"][k],
            "loop_lag_ms": row["per_seed_loop_lag_ms"][k],
            "send_late_ms": row.get("per_seed_send_late_ms", [None] * len(seeds))[k],
            "prefill_skipped": row.get("per_seed_prefill_skipped", [None] * len(seeds))[k],
            "answered_score": row.get("per_seed_answered_score", [None] * len(seeds))[k],
            "engine_shares": row.get("per_seed_engine_shares", [None] * len(seeds))[k],
            "latency_ms": row["latency_ms"],
            "requests": row["requests"] // len(seeds),
            "errors": row["errors"] if k == 0 else 0,
            "run": recorded[k],
        }
        for k, seed in enumerate(seeds)
    ]


def pool(runs: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The pooled config and summary of `runs` (results payloads of `bench qos --live`).

    Pooled are the policies every run has; an agent must be the same models in each.
    Raises NotPoolable if the runs are not of one setting or share a seed."""
    if len(runs) < 2:
        raise NotPoolable("pooling needs at least two runs")
    configs = [r["config"] for r in runs]
    first = _setting(configs[0])
    for c in configs[1:]:
        other = _setting(c)
        differ = sorted(k for k in first if first[k] != other[k])
        if differ:
            raise NotPoolable(f"the runs differ in {', '.join(differ)}")
    seen: set[int] = set()
    for c in configs:
        again = seen.intersection(c["seeds"])
        if again:
            raise NotPoolable(f"seed {min(again)} is in two runs")
        seen.update(c["seeds"])
    names = [r["policy"] for r in runs[0]["results"]]
    common = [n for n in names if all(n in {x["policy"] for x in r["results"]} for r in runs)]
    agents = [n for n in configs[0]["models"] if n in common]
    for name in agents:
        if any(c["models"].get(name) != configs[0]["models"][name] for c in configs[1:]):
            raise NotPoolable(f"{name} is other models in another run")
    rows = [
        seed_row
        for run in runs
        for row in run["results"]
        if row["policy"] in common
        for seed_row in _per_seed(run["config"], row)
    ]
    config = {
        **first,
        "seeds": [s for c in configs for s in c["seeds"]],
        "pooled": [r["benchmark"] for r in runs],
        "models": {n: configs[0]["models"][n] for n in agents},
    }
    return config, summarise(rows, agents)


def pooled_name(runs: list[dict[str, Any]], agents: list[str]) -> str:
    """`<first run's setting>_pooled-<each run's first seed>_<agents>`."""
    head = runs[0]["benchmark"]
    head = head.split("_seed-")[0] if "_seed-" in head else head.split("_" + agents[0])[0]
    firsts = "-".join(str(r["config"]["seeds"][0]) for r in runs)
    return f"{head}_pooled-{firsts}_" + "_".join(agents)


def main(files: list[Path], json_path: str | None) -> None:
    runs = [json.loads(f.read_text()) for f in files]
    config, summary = pool(runs)
    agents = list(config["models"])
    write(
        pooled_name(runs, agents),
        {
            "command": "edgeroute bench qos-pool " + " ".join(f.name for f in files),
            **config,
        },
        summary,
        COLUMNS,
        json_path,
        notes=(
            f"{len(config['seeds'])} seeds of one live setting, pooled from "
            + ", ".join(config["pooled"])
            + ": intervals over every seed, and the paired differences seed by seed, as "
            "`bench qos --live` computes them for one run. Latency is each run's mean, "
            "weighted by its seeds. Policies that a run lacks are left out."
        ),
    )
