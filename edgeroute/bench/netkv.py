"""NetKV's experiments on the fat-tree simulator: `edgeroute bench netkv`.

Experiments 1 (load sweep), 2 (fixed input lengths), 3 (oversubscription x
background), 4 (telemetry period) and 6 (ablation ladder) of the NetKV paper, on a
Mooncake-format trace, on a network the oracle does not define (`sim.cluster`): links
with capacities of their own and no per-flow tier caps, uneven and moving background
with elephant flows, and an oracle fed by delayed, noisy per-tier telemetry.

Statistics: each point is `--seeds` runs (default 5) of 120 simulated seconds after
a warm-up; a seed moves the trace window, the world's randomness (background,
elephants, telemetry noise) and the tie-breaks, and is the same for every policy, so
policies are compared paired by seed. Values are means with 95% intervals. 100% load
is measured, per network: the highest rate at which least-loaded placement meets the
TTFT SLO for 90% of requests. Every decode policy breaks ties within the same epsilon.
CLA is run at three cache weights; CLA* is the best of them at each point, on the
measured runs themselves (the most favourable tuning a baseline can get).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from edgeroute.results_io import output_dir, save_figure, table, write
from edgeroute.sim.cluster import Request, SimConfig, Simulator, attainment, capacity
from edgeroute.sim.fattree import FatTreeConfig
from edgeroute.sim.workload import MOONCAKE_BLOCK, PROFILES, TraceRequest, read_trace, select
from edgeroute.stats import interval, shown
from policies import PipelineSpec

MEASURE_AT = 0.34  # the measured windows start this far into the trace
EPSILON = 1e-4  # every decode policy's tie epsilon
CLA_WEIGHTS = (0.2, 0.5, 0.8)
BACKGROUND = 0.2  # the fabric's mean background utilisation, unless swept
LENGTHS = (1024, 4096, 8192, 16384, 32768)


def spec(policy: str, **scorers: float) -> PipelineSpec:
    return PipelineSpec(policy=policy, scorers=scorers or None, tie_epsilon=EPSILON)


def cla(w: float) -> PipelineSpec:
    return spec("decode_cla", prefix_cache=w, load=round(1 - w, 3))


SCHEDULERS: dict[str, PipelineSpec] = {
    "RR": spec("decode_rr"),
    "LA": spec("decode_la"),
    "CA": spec("decode_ca"),
    **{f"CLA w={w}": cla(w) for w in CLA_WEIGHTS},
    "NetKV-topology": spec("netkv_topology"),
    "NetKV-static": spec("netkv_static"),
    "NetKV-full": spec("netkv_full"),
}
STATS = ("ttft_mean_s", "ttft_p99_s", "tbt_ms", "slo", "xfer_ms", "tier_pod", "tier_cluster")


def per_seed(reqs: list[Request], slo: float, blocked: int) -> dict[str, float]:
    """One run's statistics (NaN where nothing was served)."""
    done = [r for r in reqs if not r.rejected and not math.isnan(r.first_token)]
    if not done:
        return {k: math.nan for k in STATS} | {"requests": len(reqs), "memory_blocked": blocked}
    ttft = sorted(r.ttft for r in done)
    tbts = [r.tbt for r in done if not math.isnan(r.tbt)]
    return {
        "ttft_mean_s": statistics.fmean(ttft),
        "ttft_p99_s": ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))],
        "tbt_ms": statistics.fmean(tbts) * 1e3 if tbts else math.nan,
        "slo": attainment(reqs, slo),
        "xfer_ms": statistics.fmean(r.transfer for r in done) * 1e3,
        "tier_pod": sum(r.tier == "pod" for r in done) / len(done),
        "tier_cluster": sum(r.tier == "cluster" for r in done) / len(done),
        "requests": len(reqs),
        "memory_blocked": blocked,
    }


class Runner:
    """Runs points (policy x setting x seeds) and measures each network's capacity once."""

    def __init__(
        self,
        trace: list[TraceRequest],
        slo: float,
        seeds: Sequence[int],
        warmup: float,
        measure: float,
        progress: Callable[[str], None] = print,
    ) -> None:
        self.trace, self.slo, self.seeds = trace, slo, list(seeds)
        self.warmup, self.measure = warmup, measure
        self.progress = progress
        self.runs = 0
        span = trace[-1].t - trace[0].t if trace else 0.0
        self.measure_start = trace[0].t + MEASURE_AT * span
        self.seed_step = span / 12  # each seed's window starts a further 1/12 on
        self._capacity: dict[FatTreeConfig, float] = {}

    def config(self, scheduler: PipelineSpec, tree: FatTreeConfig, **extra: Any) -> SimConfig:
        return SimConfig(
            scheduler,
            rate=1.0,
            tree=tree,
            warmup=self.warmup,
            measure=self.measure,
            slo_s=self.slo,
            trace_start=self.measure_start,
            **extra,
        )

    def capacity(self, tree: FatTreeConfig) -> float:
        if tree not in self._capacity:
            started = time.time()
            base = replace(self.config(spec("decode_la"), tree), seed=self.seeds[0])
            self._capacity[tree] = capacity(self.trace, base)
            self.progress(
                f"  capacity of {tree.oversubscription:g}:1, background {tree.background:.0%}: "
                f"{self._capacity[tree]:.2f} requests/s ({time.time() - started:.0f} s)"
            )
        return self._capacity[tree]

    def run(
        self,
        scheduler: PipelineSpec,
        load: float,
        tree: FatTreeConfig,
        trace: list[TraceRequest] | None = None,
        **extra: Any,
    ) -> list[dict[str, float]]:
        rate = self.capacity(tree) * load
        out = []
        for i, seed in enumerate(self.seeds):
            cfg = replace(
                self.config(scheduler, tree, **extra),
                rate=rate,
                seed=seed,
                trace_start=self.measure_start + self.seed_step * i,
            )
            sim = Simulator(cfg, trace or self.trace)
            out.append(per_seed(sim.run(), self.slo, sim.memory_blocked))
            self.runs += 1
        return out


def point(setting: dict[str, Any], policy: str, seeds: list[dict[str, float]]) -> dict[str, Any]:
    row: dict[str, Any] = {**setting, "policy": policy, "seeds": len(seeds)}
    for k in STATS:
        row[k] = shown([s[k] for s in seeds])
        row[k + "_mean"] = interval([s[k] for s in seeds])[0]
    row["requests"] = sum(int(s["requests"]) for s in seeds)
    row["memory_blocked"] = sum(int(s["memory_blocked"]) for s in seeds)
    row["_seeds"] = seeds
    return row


def with_cla_star(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Adds CLA*: the CLA row with the lowest mean TTFT among its weights, per setting."""
    out = []
    for row in rows:
        out.append(row)
        if row["policy"] != f"CLA w={CLA_WEIGHTS[-1]}":
            continue
        mine = [
            r for r in out if r["policy"].startswith("CLA w=") and r["setting"] == row["setting"]
        ]
        best = min(mine, key=lambda r: r["ttft_mean_s_mean"])
        out.append({**best, "policy": f"CLA* (w={best['policy'][6:]})"})
    return out


def paired(
    rows: list[dict[str, Any]],
    setting: str,
    base: str,
    new: str,
    diff: Callable[[dict[str, float], dict[str, float]], float],
) -> str:
    """`diff(base's seed, new's seed)` over the seeds of one setting, as mean ± half-width;
    `base` may be a prefix (CLA* carries its weight in its name)."""
    by = {r["policy"]: r["_seeds"] for r in rows if r["setting"] == setting}
    base_name = next((p for p in by if p.startswith(base)), None)
    if base_name is None or new not in by:
        return "n/a"
    return shown([diff(b, n) for b, n in zip(by[base_name], by[new], strict=True)])


def reduction(rows: list[dict[str, Any]], setting: str, base: str, new: str) -> str:
    """Mean-TTFT reduction of `new` against `base`, in %, paired by seed."""
    return paired(
        rows,
        setting,
        base,
        new,
        lambda b, n: (b["ttft_mean_s"] - n["ttft_mean_s"]) / b["ttft_mean_s"] * 100,
    )


def slo_gain(rows: list[dict[str, Any]], setting: str, base: str, new: str) -> str:
    """SLO attainment of `new` minus `base`, percentage points, paired by seed."""
    return paired(rows, setting, base, new, lambda b, n: (n["slo"] - b["slo"]) * 100)


def fixed_length(trace: list[TraceRequest], tokens: int) -> list[TraceRequest]:
    """Experiment 2: the trace's arrivals and outputs, every input `tokens` long; the
    request's own block hashes, cut or extended with blocks of its own."""
    blocks = math.ceil(tokens / MOONCAKE_BLOCK)
    out = []
    for i, r in enumerate(trace):
        own = tuple(-(i * 1000 + k + 1) for k in range(max(0, blocks - len(r.hash_ids))))
        out.append(TraceRequest(r.t, tokens, r.output_len, (r.hash_ids + own)[:blocks]))
    return out


def main(
    quick: bool,
    seed: int,
    json_path: str | None,
    trace_path: str | None,
    profile: str = "rag",
    seeds: int = 5,
) -> None:
    from workers.quality import default_data_dir

    started = time.time()
    path = (
        Path(trace_path)
        if trace_path
        else (default_data_dir() / "mooncake" / "conversation_trace.jsonl.gz")
    )
    prof = PROFILES[profile]
    trace = select(read_trace(path), prof)
    if not trace:
        raise ValueError(f"{path}: no request of the {profile} profile in this trace")
    seed_list = list(range(seed, seed + (1 if quick else seeds)))
    runner = Runner(
        trace,
        prof.slo_s,
        seed_list,
        warmup=5.0 if quick else 10.0,
        measure=20.0 if quick else 120.0,
    )
    print(
        f"trace {path.name}: {len(trace)} {profile} requests; seeds {seed_list}; "
        f"{runner.measure:g} s measured per run",
        flush=True,
    )
    tree = FatTreeConfig(background=BACKGROUND)
    rows: list[dict[str, Any]] = []

    def sweep(
        experiment: str,
        setting: dict[str, Any],
        names: Sequence[str],
        load: float,
        tree: FatTreeConfig,
        trace: list[TraceRequest] | None = None,
        **extra: Any,
    ) -> None:
        label = ", ".join(f"{k} {v}" for k, v in setting.items())
        found = []
        for name in names:
            seeds_out = runner.run(SCHEDULERS[name], load, tree, trace, **extra)
            found.append(
                point({"experiment": experiment, "setting": label, **setting}, name, seeds_out)
            )
        found = with_cla_star(found)
        rows.extend(found)
        best = {r["policy"]: r["ttft_mean_s"] for r in found}
        print(
            f"  {experiment} {label}: " + "; ".join(f"{k} {v}" for k, v in best.items()), flush=True
        )

    cla_names = [f"CLA w={w}" for w in CLA_WEIGHTS]
    # Experiment 1: load sweep.
    for load in (1.0, 2.0) if quick else (0.5, 1.0, 1.5, 2.0, 2.5):
        names = ["RR", "LA", "CA", *cla_names, "NetKV-static", "NetKV-full"]
        sweep("1-load", {"load_pct": int(load * 100)}, names, load, tree)
    # Experiment 2: fixed input lengths, at the trace's 100% rate.
    for tokens in (4096, 16384) if quick else LENGTHS:
        names = ["RR", "CA", *cla_names, "NetKV-full"]
        sweep("2-length", {"input_tokens": tokens}, names, 1.0, tree, fixed_length(trace, tokens))
    # Experiment 3: oversubscription x background.
    grid = [(4.0, 0.2)] if quick else [(r, b) for r in (1.0, 4.0, 8.0) for b in (0.0, 0.4)]
    for ratio, bg in grid:
        t3 = FatTreeConfig(oversubscription=ratio, background=bg)
        names = [*cla_names, "NetKV-static", "NetKV-full"]
        sweep("3-topology", {"oversubscription": ratio, "background": bg}, names, 1.0, t3)
    # Experiment 4: the telemetry period (delivery delay one period, at most 5 s).
    for period in (1.0, 30.0) if quick else (0.1, 1.0, 5.0, 15.0, 60.0):
        names = [*cla_names, "NetKV-static", "NetKV-full"]
        sweep(
            "4-staleness",
            {"telemetry_period_s": period},
            names,
            1.0,
            tree,
            oracle_interval=period,
            telemetry_delay=min(period, 5.0),
        )
    # Experiment 6: the ablation ladder.
    names = [*cla_names, "NetKV-topology", "NetKV-static", "NetKV-full"]
    sweep("6-ablation", {"load_pct": 100}, names, 1.0, tree)

    report(rows, runner, path, profile, seed_list, started, quick, json_path, seed)


def report(
    rows: list[dict[str, Any]],
    runner: Runner,
    path: Path,
    profile: str,
    seeds: list[int],
    started: float,
    quick: bool,
    json_path: str | None,
    seed: int,
) -> None:
    prof = PROFILES[profile]
    headline = []
    for r in rows:
        if r["policy"] != "NetKV-full" or r["experiment"] not in ("1-load", "2-length"):
            continue
        s = r["setting"]
        headline.append(
            {
                "experiment": r["experiment"],
                "setting": s,
                "vs RR (%)": reduction(rows, s, "RR", "NetKV-full"),
                "vs CLA* (%)": reduction(rows, s, "CLA*", "NetKV-full"),
                "vs LA (%)": reduction(rows, s, "LA", "NetKV-full"),
                "SLO vs RR (pp)": slo_gain(rows, s, "RR", "NetKV-full"),
                "SLO vs CLA* (pp)": slo_gain(rows, s, "CLA*", "NetKV-full"),
            }
        )
    cols = ["policy", *STATS, "requests", "memory_blocked"]
    capacities = "; ".join(
        f"{t.oversubscription:g}:1 background {t.background:.0%}: {c:.2f}/s"
        for t, c in runner._capacity.items()
    )

    def section(title: str, experiment: str, first: str) -> str:
        mine = [r for r in rows if r["experiment"] == experiment]
        return f"## {title}\n\n" + table(mine, [first, *cols]) if mine else ""

    notes = "\n\n".join(
        [
            f"Trace: `{path.name}` ({profile}: inputs {prof.min_input}-{prof.max_input} tokens, "
            f"TTFT SLO {prof.slo_s} s). Seeds {seeds}; {runner.measure:g} s measured after "
            f"{runner.warmup:g} s of warm-up per run, windows from trace second "
            f"{runner.measure_start:.0f}, a further {runner.seed_step:.0f} s per seed. "
            f"{runner.runs} simulations in {time.time() - started:.0f} s. Background "
            f"{BACKGROUND:.0%} unless swept. Measured capacities (100% load): {capacities}. "
            "Values: mean ± 95% half-width over seeds; reductions paired by seed. "
            "`memory_blocked`: admissions that waited for decode KV memory (all seeds).",
            "## Headline: NetKV-full against the baselines (paired by seed)\n\n"
            + (table(headline, list(headline[0])) if headline else "(none)"),
            section("Experiment 1: load sweep", "1-load", "load_pct"),
            section("Experiment 2: fixed input lengths (100% load)", "2-length", "input_tokens"),
            section(
                "Experiment 3: oversubscription x background (100% load)",
                "3-topology",
                "setting",
            ),
            section("Experiment 4: telemetry period (100% load)", "4-staleness", "setting"),
            section("Experiment 6: ablation ladder (100% load)", "6-ablation", "setting"),
        ]
    )
    public = [{k: v for k, v in r.items() if k != "_seeds"} for r in rows]
    for r, full in zip(public, rows, strict=True):
        r["per_seed"] = full["_seeds"]
    write(
        "netkv",
        {
            "command": "edgeroute bench netkv" + (" --quick" if quick else ""),
            "trace": str(path.name),
            "profile": profile,
            "seeds": seeds,
            "seed": seed,
            "measure_s": runner.measure,
            "background": BACKGROUND,
            "tie_epsilon": EPSILON,
            "cla_weights": list(CLA_WEIGHTS),
        },
        public,
        list(headline[0]) if headline else ["experiment", "setting", *cols],
        json_path,
        notes=notes,
        quick=quick,
        table_rows=headline,
    )
    print("\n" + notes.split("## Experiment 1")[0])
    plot(rows, output_dir(quick) / "netkv.png")


def plot(rows: list[dict[str, Any]], out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots (pip install matplotlib)")
        return

    def series(
        experiment: str, policy: str, x: str
    ) -> tuple[list[float], list[float], list[float]]:
        mine = [r for r in rows if r["experiment"] == experiment and r["policy"].startswith(policy)]
        xs = [float(r[x]) for r in mine]
        stats = [interval([s["ttft_mean_s"] for s in r["_seeds"]]) for r in mine]
        return xs, [m for m, _ in stats], [h for _, h in stats]

    fig, axes = plt.subplots(1, 4, figsize=(21, 4.2))
    panels = (
        ("1-load", "load_pct", ("RR", "LA", "CLA*", "NetKV-full"), "Exp. 1: load", "load (%)"),
        ("2-length", "input_tokens", ("RR", "CA", "CLA*", "NetKV-full"), "Exp. 2: input", "tokens"),
        (
            "4-staleness",
            "telemetry_period_s",
            ("CLA*", "NetKV-static", "NetKV-full"),
            "Exp. 4: telemetry period",
            "period (s)",
        ),
    )
    for ax, (experiment, x, policies, title, xlabel) in zip(axes, panels, strict=False):
        for policy in policies:
            xs, ys, hs = series(experiment, policy, x)
            if xs:
                ax.errorbar(xs, ys, yerr=hs, marker="o", capsize=3, label=policy)
        ax.set(title=title + " (mean TTFT, 95% CI)", xlabel=xlabel, ylabel="mean TTFT (s)")
        if experiment != "1-load":
            ax.set_xscale("log")
        ax.legend(fontsize=8)
    ax = axes[3]
    ladder = [
        r for r in rows if r["experiment"] == "6-ablation" and not r["policy"].startswith("CLA w")
    ]
    stats = [interval([s["ttft_mean_s"] for s in r["_seeds"]]) for r in ladder]
    ax.bar(
        [r["policy"].split(" (")[0] for r in ladder],
        [m for m, _ in stats],
        yerr=[h for _, h in stats],
        capsize=3,
        color="tab:blue",
    )
    ax.set(title="Exp. 6: ablation ladder", ylabel="mean TTFT (s)")
    ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    save_figure(fig, out)
