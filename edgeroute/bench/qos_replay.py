"""A live QoS run's own request streams, replayed in the simulator: `edgeroute bench
qos-replay LIVE.json` after the run, and `edgeroute bench qos --live --predict` before it.

`bench qos --live` and the simulated sweeps draw their request streams from different
seeds, so live and simulated figures could be compared only by their means. This
rebuilds every seed of a live results file (`qos_live.live_stream`: the same prompts in
the same order at the same instants) and runs it in the simulator on the live run's
engines (`engine_experts`, as many as the run had), with the same policies
(RR, least-load, BR, and each agent's training run k on seed k, as live). It reports
live minus simulated QoS, paired by seed: where the simulator and the engines the
gateway serves disagree, and for which policies. `Physics` sets the simulated world
(slower engines, a prefix cache): a calibration's test.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeroute.bench.qos import Physics, Sweep, heuristics, recorded_serving, refuse_other_serving
from edgeroute.bench.qos_live import (
    ARRIVALS,
    LivePlan,
    live_stream,
    recorded_predictor,
    served_run,
)
from edgeroute.qos.evaluate import Policy, evaluate, served
from edgeroute.results_io import Plot, write
from edgeroute.sim.edge import Arrival, Quality, Task
from edgeroute.stats import paired, paired_each, shown
from policies.qos_drl import load

COLUMNS = [
    "policy",
    "live_qos_ci",
    "sim_qos_ci",
    "live_minus_sim",
    "correlation",
    "prefill_skipped",
    "live_prefill_skipped",
]


def recorded_quality(config: dict[str, Any]) -> Quality:
    """The live run's quality world: recorded in its config since 2026-11-30, and for
    earlier files read from its command (`--quality routerdc`, else the default)."""
    if "quality" in config:
        quality: Quality = config["quality"]
        return quality
    return "routerdc" if "--quality routerdc" in config["command"] else "routerbench"


def replayed(tasks: Sequence[Task], gaps: Sequence[float]) -> list[Arrival]:
    """A stream (tasks, gaps) as the simulator's arrivals: each request at its instant
    with its own prompt, and the last once more, never routed, for the last decision
    to wait for (`Sweep.env`'s `stream`)."""
    return _arrivals(tasks, list(itertools.accumulate(gaps)))


def _arrivals(tasks: Sequence[Task], times: Sequence[float]) -> list[Arrival]:
    arrivals = [Arrival(t, task=task) for t, task in zip(times, tasks, strict=True)]
    return [*arrivals, arrivals[-1]]


@dataclass(frozen=True)
class Lateness:
    """How late the live client's sends came after their instants, replayed: each
    request delayed by an exponential draw of mean `mean_ms` (emulated ms), none sent
    before the one ahead of it, as the client's loop sends them; each seed replayed under
    `draws` draws and scored by their mean. The default sends on time, once."""

    mean_ms: float = 0.0
    draws: int = 1

    def __post_init__(self) -> None:
        if not (math.isfinite(self.mean_ms) and self.mean_ms >= 0):
            raise ValueError(f"the mean lateness must be finite and >= 0 ms, not {self.mean_ms:g}")
        if self.draws < 1 or (self.draws > 1 and self.mean_ms == 0):
            raise ValueError(
                f"{self.draws} draws of lateness: at least one, and more only with a "
                "mean lateness above 0"
            )

    def streams(
        self, tasks: Sequence[Task], gaps: Sequence[float], seed: int
    ) -> list[list[Arrival]]:
        """The seed's stream once per draw (draw d from its own generator, so a seed's
        draws are the same in every run)."""
        if self.mean_ms == 0:
            return [replayed(tasks, gaps)]
        times = list(itertools.accumulate(gaps))
        streams = []
        for d in range(self.draws):
            rng = random.Random(f"lateness {seed} {d}")
            late = (t + rng.expovariate(1000 / self.mean_ms) for t in times)
            streams.append(_arrivals(tasks, list(itertools.accumulate(late, max))))
        return streams

    def named(self, base: str) -> tuple[str, str]:
        """The results' name and the flags that give this lateness."""
        if self.mean_ms == 0:
            return base, ""
        return (
            f"{base}_late-{self.mean_ms:g}ms-x{self.draws}",
            f" --send-late-ms {self.mean_ms:g} --draws {self.draws}",
        )

    def describe(self) -> str:
        """For a results file's notes ("" when on time)."""
        if self.mean_ms == 0:
            return ""
        return (
            f"each request sent late by an exponential draw of mean {self.mean_ms:g} ms "
            f"(none before the one ahead of it), {self.draws} draws per seed, the seed's "
            "QoS their mean (`--send-late-ms`, `--draws`)"
        )


class Replay:
    """A live run's world in the simulator: its prompts, predictor, engines and scrape,
    under `physics`, its requests sent with `lateness`."""

    def __init__(
        self, config: dict[str, Any], physics: Physics, lateness: Lateness | None = None
    ) -> None:
        from workers.quality import default_data_dir

        if config.get("max_batch") is not None:
            raise ValueError(
                f"its engines ran at most {config['max_batch']} requests at once; "
                "replaying a capped batch is not supported"
            )
        self.config = config
        self.lateness = lateness or Lateness()
        self.quality = recorded_quality(config)
        self.predictor = recorded_predictor(config)
        self.sweep = Sweep.of(
            self.quality,
            default_data_dir(),
            self.predictor,
            hardware="engines",
            scrape_ms=config["scrape_ms"],
            physics=physics,
        )

    def policies(self) -> dict[str, list[Policy]]:
        """The live run's policies by name: its heuristics, and each agent's training
        runs served as they were."""
        quality, latency_ms = self.quality, self.config["latency_ms"]
        serving = recorded_serving(self.config["command"])
        fixed = heuristics(quality, self.predictor)
        policies: dict[str, list[Policy]] = {k: [fixed[k]] for k in ("RR", "least_load", "BR")}
        for name, runs in self.config["models"].items():
            params = serving.get(name, {})
            policies[name] = [served(load(Path(d), latency_ms, **params)) for d in runs]
        return policies

    def run(self, runs: Sequence[Policy]) -> tuple[list[float], float]:
        """One policy's simulated QoS on every seed of the live run (training run k on
        seed k), and the share of prompt tokens its experts' prefix caches skipped."""
        c = self.config
        sim, prompt, cached = [], 0, 0
        for k, seed in enumerate(c["seeds"]):
            tasks, gaps = live_stream(self.sweep.tasks, seed, c["requests_per_seed"], c["rate"])
            draws = []
            for stream in self.lateness.streams(tasks, gaps, seed):
                env = self.sweep.env(0, c["engines"], c["rate"], c["latency_ms"], stream=stream)
                draws.append(evaluate(env, runs[served_run(k, len(runs))], [seed]).qos)
                prompt += sum(e.prompt_total for e in env.experts)
                cached += sum(e.skipped_total for e in env.experts)
            sim.append(statistics.fmean(draws))
        return sim, cached / prompt if prompt else 0.0


# What a `bench qos --live` results file holds that a replay reads.
LIVE_CONFIG = (
    "command",
    "seeds",
    "requests_per_seed",
    "rate",
    "latency_ms",
    "scrape_ms",
    "engines",
    "models",
)


def read_live(path: Path) -> dict[str, Any]:
    """A live run's results, or ValueError saying why the file is not one: every
    setting the replay needs, and each policy's QoS on every seed."""
    try:
        live: dict[str, Any] = json.loads(path.read_text())
        config, results = live["config"], live["results"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"not a results file ({exc})") from None
    missing = [k for k in LIVE_CONFIG if k not in config]
    if missing or not str(config["command"]).startswith("edgeroute bench qos --live"):
        raise ValueError(
            "not the results of `edgeroute bench qos --live`"
            + (f" (no {', '.join(missing)})" if missing else "")
        )
    seeds = len(config["seeds"])
    for r in results:
        if len(r.get("per_seed_qos") or ()) != seeds:
            raise ValueError(f"{r.get('policy')}: its QoS is not given for each of {seeds} seeds")
    return live


PROFILED = "their profiles as they are, no prefix cache, sent on time"


def _world(base: str, physics: Physics, lateness: Lateness) -> tuple[str, str, str, dict[str, Any]]:
    """A replay's results name from `base`, the flags that give its world, the words
    for its notes ("" for the profiles as they are, sent on time: `PROFILED`) and the
    config entries that record it."""
    name, flags = physics.named(base)
    name, late_flags = lateness.named(name)
    words = "; ".join(w for w in (physics.describe(), lateness.describe()) if w)
    recorded = {
        "time_scale": physics.time_scale,
        "prefix_cache": physics.prefix_cache,
        "send_late_ms": lateness.mean_ms,
        "draws": lateness.draws,
    }
    return name, flags + late_flags, words, recorded


def main(
    live_path: Path, physics: Physics, json_path: str | None, lateness: Lateness | None = None
) -> None:
    lateness = lateness or Lateness()
    try:
        live = read_live(live_path)
        replay = Replay(live["config"], physics, lateness)
    except ValueError as exc:
        raise SystemExit(f"edgeroute bench qos-replay: {live_path}: {exc}") from None
    config = live["config"]
    latency_ms, requests, rate = config["latency_ms"], config["requests_per_seed"], config["rate"]
    live_rows = {r["policy"]: r for r in live["results"]}
    live_qos = {name: r["per_seed_qos"] for name, r in live_rows.items()}
    policies = replay.policies()
    if missing := [name for name in policies if name not in live_qos]:
        raise SystemExit(f"edgeroute bench qos-replay: {live_path}: no live QoS of {missing}")
    rows = []
    for name, runs in policies.items():
        sim, skipped = replay.run(runs)
        there = live_qos[name]
        rows.append(
            {
                "policy": name,
                "live_qos_ci": shown(there),
                "sim_qos_ci": shown(sim),
                "live_minus_sim": paired(there, sim),
                "live_minus_sim_mean": statistics.fmean(there) - statistics.fmean(sim),
                "correlation": _correlation(there, sim),
                "prefill_skipped": f"{skipped:.0%}" if physics.prefix_cache else "",
                "live_prefill_skipped": live_rows[name].get("prefill_skipped", ""),
                "per_seed_live_qos": there,
                "per_seed_sim_qos": sim,
            }
        )
        print(
            f"  {name:<16} live {rows[-1]['live_qos_ci']}  sim {rows[-1]['sim_qos_ci']}  "
            f"live - sim {rows[-1]['live_minus_sim']}",
            flush=True,
        )
    base, flags, world, recorded = _world(
        "qos_replay" + live["benchmark"].removeprefix("qos_live"), physics, lateness
    )
    write(
        base,
        {
            "command": f"edgeroute bench qos-replay {live_path}{flags}",
            "live": str(live_path),
            "live_command": config["command"],
            **recorded,
        },
        rows,
        COLUMNS,
        json_path,
        plot=Plot(
            x="policy",
            y=("live_minus_sim_mean",),
            title=f"live minus simulated QoS ({flags.strip() or 'the profiles, no cache'})",
        ),
        notes=(
            f"Each of the live run's {len(config['seeds'])} seeds ({config['seeds'][0]}-"
            f"{config['seeds'][-1]}) replayed in the simulator: its {requests} prompts in "
            f"order at their instants ({rate:g}/s), L = {latency_ms:g} ms, the live run's "
            f"{config['engines']} engine profiles as experts"
            + f" ({world or PROFILED})"
            + f", the engines' metrics scraped every {config['scrape_ms']:g} ms, each agent's "
            "training run k on seed k as live. `live_minus_sim`: paired by seed, 95% "
            "interval; `correlation`: of the per-seed QoS, live against simulated; "
            "`prefill_skipped`: the share of prompt tokens the simulated prefix caches "
            "skipped (empty without them), `live_prefill_skipped` the live engines' "
            "(empty for runs from before 2026-11-30, afternoon, which did not record it)."
            + (
                ""
                if config.get("arrivals") == ARRIVALS
                else " The live run is older than the client's paced sends "
                "(`qos_live.ARRIVALS`): it slept each gap in turn, so its engines saw "
                "3-5% fewer arrivals per second than replayed here."
            )
        ),
    )


PREDICTED_COLUMNS = ["policy", "predicted_qos_ci", "minus_least_load", "paired_minus_agents"]


def predict(
    run: LivePlan, physics: Physics, json_path: str | None, lateness: Lateness | None = None
) -> None:
    """`bench qos --live --predict`: the live run `run` in the simulator before it runs,
    on its own streams, engines, scrape and agents, under `physics`; written to be
    committed (and declared) before the run. `bench qos-replay` of the run's results
    later gives the same simulated figures beside the live ones. `lateness`: the sends
    as late as the live client's will be."""
    lateness = lateness or Lateness()
    c = run.config
    base, flags, world, recorded = _world(
        "qos_predicted" + run.name.removeprefix("qos_live"), physics, lateness
    )
    refuse_other_serving(base, run.serving, run.quick)
    try:
        replay = Replay(c, physics, lateness)
    except ValueError as exc:
        raise SystemExit(f"edgeroute bench qos --live --predict: {exc}") from None
    per_seed: dict[str, list[float]] = {}
    for name, runs in replay.policies().items():
        per_seed[name] = replay.run(runs)[0]
        print(f"  {name:<16} predicted {shown(per_seed[name])}", flush=True)
    first, *others = run.models
    rows = [
        {
            "policy": name,
            "predicted_qos_ci": shown(qos),
            "minus_least_load": "" if name == "least_load" else paired(qos, per_seed["least_load"]),
            "paired_minus_agents": paired_each(qos, {o: per_seed[o] for o in others})
            if name == first
            else "",
            "per_seed_qos": qos,
        }
        for name, qos in per_seed.items()
    ]
    write(
        base,
        {
            "command": c["command"].replace("--live", "--live --predict", 1) + flags,
            "live": c,
            **recorded,
        },
        rows,
        PREDICTED_COLUMNS,
        json_path,
        notes=(
            f"The live run `{c['command']}` predicted in the simulator before it ran: each "
            f"of its {len(c['seeds'])} seeds' {c['requests_per_seed']} prompts in order at "
            f"their instants ({c['rate']:g}/s), L = {c['latency_ms']:g} ms, its "
            f"{c['engines']} engine profiles as experts ({world or PROFILED}), the engines' "
            "metrics "
            f"scraped every {c['scrape_ms']:g} ms, each agent's training run k on seed k as "
            "live. Intervals are 95% over the seeds; `minus_least_load` and "
            "`paired_minus_agents` (the first agent minus each other) are paired by seed."
        ),
        quick=run.quick,
    )


def _correlation(a: list[float], b: list[float]) -> str:
    if len(a) < 3 or statistics.pstdev(a) == 0 or statistics.pstdev(b) == 0:
        return ""
    r = statistics.correlation(a, b)
    return "" if math.isnan(r) else f"{r:+.2f}"
