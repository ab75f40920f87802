"""Prism against the placement baselines: `edgeroute bench prism`.

Three heterogeneous servers (1, 1 and 2 GPUs, memory capped so that the model fits
with little room to spare, as in the paper), each with its own Poisson request stream.
Mixes (`--mix`): specialised (each server its own BIG-bench-like task), blended (every
server the same blend of those three tasks) and uniform (every expert equally likely:
nothing for placement to learn); Mixtral-8x7B and DeepSeek-V2-Lite shapes; activation
skew calibrated from real Mixtral routing (`workers.moe`), the tasks themselves
synthetic. Placements are planned from a warm-up
window. A data-shift run (each server's task changes halfway) re-plans every 5 minutes
and migrates only when eq. 4 holds (the paper's Fig. 7).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import numpy as np

from edgeroute.bench.stats import interval, shown
from edgeroute.results_io import output_dir, save_figure, table, write
from edgeroute.sim.moe import Result, simulate
from policies.prism import Server, eplb, prism, redundance, smartmoe, uniform
from workers.moe import DEEPSEEK_V2_LITE, MIXTRAL, CostModel, MoEShape, task_distribution

# Expert size (GB at fp16) and per-GPU memory cap for each shape, and its cost model.
MODELS: dict[str, tuple[MoEShape, float, float, CostModel]] = {
    "deepseek-v2-lite": (
        DEEPSEEK_V2_LITE,
        0.0173,
        8.0,
        CostModel(local_expert_s=0.0005, hidden_bytes=4096),
    ),
    "mixtral-8x7b": (MIXTRAL, 0.35, 24.0, CostModel()),
}
SPECIALISED = ("bigbench-narrative", "bigbench-arithmetic", "bigbench-ascii")
MIXES = ("specialised", "blended", "uniform")
# The data shift: each server's task before and after.
SHIFT = (
    ("mmlu-pro", "bigbench-narrative"),
    ("wikitext", "bigbench-arithmetic"),
    ("taco", "bigbench-ascii"),
)


def mix_distributions(mix: str, shape: MoEShape, data: Path) -> list[list[np.ndarray]]:
    """Each server's activation distribution (one phase) under a mix."""
    own = [task_distribution(shape, t, data) for t in SPECIALISED]
    if mix == "specialised":
        return [[d] for d in own]
    if mix == "blended":
        blend: np.ndarray = np.mean(np.stack(own), axis=0)
        return [[blend] for _ in own]
    if mix == "uniform":
        flat = np.full((shape.layers, shape.experts), 1.0 / shape.experts)
        return [[flat] for _ in own]
    raise ValueError(f"unknown mix {mix!r}; known: {list(MIXES)}")


PAPER = "Table II: Prism 30.6% below EPLB on DeepSeek-V2-Lite BigBench; slight gain on Mixtral"


def servers_for(mem: float) -> list[Server]:
    return [
        Server("server1", (mem,), (2.0,)),
        Server("server2", (mem,), (2.0,)),
        Server("server3", (mem, mem), (2.0, 2.0)),
    ]


def planners(servers: list[Server], shape: MoEShape, size: float, seed: int) -> dict[str, Any]:
    """Each placement, as a function of the activation statistics; the random baselines
    draw with the run's seed."""
    return {
        "Uniform": lambda st: uniform(servers, shape.experts, shape.layers, size, seed),
        "Redundance": lambda st: redundance(servers, shape.experts, shape.layers, size, seed),
        "SmartMoE": lambda st: smartmoe(servers, shape.experts, size, st),
        "EPLB": lambda st: eplb(servers, shape.experts, size, st),
        "Prism": lambda st: prism(servers, shape.experts, size, st),
    }


def main(
    quick: bool,
    seed: int,
    json_path: str | None,
    mixes: tuple[str, ...] = MIXES,
    seed_count: int = 5,
) -> None:
    from workers.quality import default_data_dir

    data = default_data_dir()
    seeds = [seed] if quick else [seed + i for i in range(seed_count)]
    duration = 200.0 if quick else 600.0
    rows: list[dict[str, Any]] = []
    for model, (shape, size, mem, cost) in MODELS.items():
        servers = servers_for(mem)
        for setup in mixes:
            dists = mix_distributions(setup, shape, data)
            for name in planners(servers, shape, size, 0):
                runs: list[Result] = [
                    simulate(
                        servers,
                        shape,
                        dists,
                        planners(servers, shape, size, s)[name],
                        duration=duration,
                        cost=cost,
                        expert_size=size,
                        seed=s,
                    )
                    for s in seeds
                ]
                per_server = [
                    statistics.fmean(v for r in runs for v in r.latency[n])
                    for n in range(len(servers))
                ]
                rows.append(
                    {
                        "model": model,
                        "setup": setup,
                        "policy": name,
                        **{f"server{n + 1}_s": per_server[n] for n in range(len(servers))},
                        "avg_s": statistics.fmean(
                            v for r in runs for lat in r.latency for v in lat
                        ),
                        "local_ratio": statistics.fmean(x for r in runs for _, x in r.local),
                        "avg_s_ci": shown([_mean_latency(r) for r in runs]),
                        "per_seed_avg_s": [_mean_latency(r) for r in runs],
                    }
                )
            best = min(
                (r for r in rows if r["model"] == model and r["setup"] == setup),
                key=lambda r: r["avg_s"],
            )
            print(f"  {model} {setup}: best {best['policy']} ({best['avg_s']:.2f} s)", flush=True)
    shift = data_shift(data, seeds, quick)
    headline = []
    for model in MODELS:
        for setup in mixes:
            get = {
                r["policy"]: r["per_seed_avg_s"]
                for r in rows
                if r["model"] == model and r["setup"] == setup
            }
            paired = [(e - p) / e * 100 for e, p in zip(get["EPLB"], get["Prism"], strict=True)]
            headline.append(
                {
                    "model": model,
                    "setup": setup,
                    "prism_vs_eplb_pct": interval(paired)[0],
                    "prism_vs_eplb_ci": shown(paired),
                }
            )
    notes = "\n\n".join(
        [
            f"Paper: {PAPER}. {len(seeds)} seed(s), {duration:.0f} s per run, 20 tokens a "
            "request, Poisson arrivals every 10 s per server.",
            "## Headline: Prism's average-latency reduction over EPLB (%, paired by seed, "
            "mean ± 95% half-width)\n\n" + table(headline, ["model", "setup", "prism_vs_eplb_ci"]),
            "## Data shift (DeepSeek-V2-Lite; mixed tasks, then specialised at half time; "
            "re-planning every 300 s)\n\n"
            + table(
                shift,
                [
                    "policy",
                    "avg_s",
                    "first_half_s",
                    "second_half_s",
                    "after_migration_s",
                    "migrations (s, per seed)",
                ],
            ),
        ]
    )
    write(
        "prism",
        {
            "command": "edgeroute bench prism" + (" --quick" if quick else ""),
            "seeds": seeds,
            "duration_s": duration,
        },
        rows,
        [
            "model",
            "setup",
            "policy",
            "server1_s",
            "server2_s",
            "server3_s",
            "avg_s",
            "avg_s_ci",
            "local_ratio",
        ],
        json_path,
        notes=notes,
        quick=quick,
    )
    print("\n" + notes.split("## Data shift")[0])


def _mean_latency(r: Result) -> float:
    return statistics.fmean(v for lat in r.latency for v in lat)


def data_shift(data: Path, seeds: list[int], quick: bool) -> list[dict[str, Any]]:
    """Fig. 7: with and without migration, when every server's task changes halfway.

    Averages over `seeds`; `after_migration_s` is over the same window for both runs of
    a seed: from 100 s after the migrating run's first re-plan after the shift."""
    shape, size, mem, cost = MODELS["deepseek-v2-lite"]
    servers = servers_for(mem)
    tasks = [
        [task_distribution(shape, a, data), task_distribution(shape, b, data)] for a, b in SHIFT
    ]
    duration = 600.0 if quick else 1800.0
    half = duration / 2
    labels = (("Prism, static", None), ("Prism, migrating", 300.0))
    sums: dict[str, dict[str, float]] = {label: {} for label, _ in labels}
    migrations: dict[str, list[str]] = {label: [] for label, _ in labels}
    timelines: dict[str, Result] = {}
    for seed in seeds:
        runs = {
            label: simulate(
                servers,
                shape,
                tasks,
                planners(servers, shape, size, seed)["Prism"],
                duration=duration,
                cost=cost,
                expert_size=size,
                seed=seed,
                replan=replan,
            )
            for label, replan in labels
        }
        moved = [m for m in runs["Prism, migrating"].migrations if m >= half]
        settled = (moved[0] if moved else half) + 100.0
        for label, r in runs.items():
            lat = [
                (t, v)
                for n in range(len(servers))
                for t, v in zip(r.arrivals[n], r.latency[n], strict=True)
            ]
            windows = {
                "avg_s": [v for _, v in lat],
                "first_half_s": [v for t, v in lat if t < half],
                "second_half_s": [v for t, v in lat if t >= half],
                "after_migration_s": [v for t, v in lat if t >= settled],
            }
            for key, values in windows.items():
                sums[label][key] = sums[label].get(key, 0.0) + statistics.fmean(values)
            migrations[label].append(", ".join(f"{m:.0f}" for m in r.migrations) or "none")
        if not timelines:
            timelines = runs
    plot(timelines, duration, output_dir(quick) / "prism_shift.png")
    return [
        {
            "policy": label,
            **{key: total / len(seeds) for key, total in sums[label].items()},
            "migrations (s, per seed)": "; ".join(migrations[label]),
        }
        for label, _ in labels
    ]


def plot(timelines: dict[str, Result], duration: float, out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for label, r in timelines.items():
        ax.plot([t for t, _ in r.local], [x for _, x in r.local], label=label)
        for m in r.migrations:
            ax.axvline(m, color="grey", linestyle=":", linewidth=0.8)
    ax.axvline(duration / 2, color="red", linestyle="--", linewidth=0.8, label="data shift")
    ax.set(
        xlabel="time (s)",
        ylabel="local compute ratio",
        title="Prism data shift (DeepSeek-V2-Lite): migrations at dotted lines",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, out)
