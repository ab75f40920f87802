"""Where each policy sends its requests, and what each engine gives back for them:
`edgeroute bench qos-shares`.

On the live run's engines (`engine_experts`) at one setting (N, lambda, L), every
policy's routed requests are counted engine by engine over the environment seeds: the
share of them it sent there, their mean score (the quality of the answers it chose),
the share that met L, and the mean QoS (eq. 1) they earned. Where an agent falls behind
at one setting, this says where: an engine sent more than it can serve within L, or
requests sent where L cannot be met at all. An agent's training runs are pooled, each
run on every seed.

A second table (`…_by-load`) splits each engine's share by how many requests it held
(running and waiting) as each request arrived: whether a policy sends an engine less the
busier it is, and how often what it sends at each count meets L.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

from edgeroute.bench.qos import (
    Sweep,
    agents_named,
    heuristics,
    predictor_named,
    run_predictor,
    scrape_named,
    timed_trace,
    trace_named,
)
from edgeroute.qos.config import DEFAULT_LATENCY_MS, DEFAULT_RATE, quality_suffix
from edgeroute.qos.evaluate import Policy, episode, episode_qos, served
from edgeroute.results_io import Plot, recorded, write
from edgeroute.sim.edge import QUALITY_MODELS, EdgeEnv, Quality, engine_fleet
from policies.qos_drl import load
from workers.profiles import PROFILES

COLUMNS = ["policy", "engine", "sent", "score", "met", "qos", "policy_qos"]
LOAD_COLUMNS = ["policy", "engine", "in_flight", "decisions", "sent", "met"]
# In-flight counts are read in buckets this wide, the last one open: 0-4, ..., 20+.
IN_FLIGHT_STEP, IN_FLIGHT_BUCKETS = 5, 5


@dataclass(frozen=True)
class EngineShare:
    """One policy's requests on one engine, pooled over seeds (and training runs)."""

    engine: str  # the model it answers as @ its profile's milliseconds an iteration
    sent: float  # share of the policy's routed requests
    score: float | None  # their mean score; None if it sent none
    met: float | None  # the share of them that met L
    qos: float | None  # their mean QoS


@dataclass(frozen=True)
class LoadShare:
    """One policy's decisions made while one engine held a given number of requests,
    pooled likewise."""

    engine: str
    in_flight: str  # the bucket of its count as the request arrived: "0-4", ..., "20+"
    decisions: int  # the arrivals decided with the engine at that count
    sent: float  # the share of them sent to it
    met: float | None  # the share of those that met L; None if it was sent none


class Measured(NamedTuple):
    shares: list[EngineShare]
    by_load: list[LoadShare]  # the buckets in which some decision was made
    qos: float  # the policy's mean QoS per episode


def in_flight_bucket(count: int) -> int:
    return min(count // IN_FLIGHT_STEP, IN_FLIGHT_BUCKETS - 1)


def bucket_name(b: int) -> str:
    low = b * IN_FLIGHT_STEP
    return f"{low}+" if b == IN_FLIGHT_BUCKETS - 1 else f"{low}-{low + IN_FLIGHT_STEP - 1}"


def _watched(policy: Policy, buckets: list[list[int]]) -> Policy:
    """`policy`, noting at each decision every engine's in-flight bucket."""

    def act(env: EdgeEnv, i: int) -> int:
        buckets.append([in_flight_bucket(e.in_flight) for e in env.experts])
        return policy(env, i)

    return act


def engine_shares(
    sweep: Sweep,
    runs: Sequence[Policy],
    seeds: Sequence[int],
    n: int,
    rate: float,
    latency_ms: float,
) -> Measured:
    """Each engine's share of the routed requests of `runs` (a policy's training runs,
    or the one heuristic) over `seeds`, the same split by the engine's count in flight
    at each arrival, and the policy's mean QoS per episode (drops count 0, as
    `evaluate` counts them)."""
    names = [
        f"{model.split('/')[-1]} @ {PROFILES[profile].base * 1e3:g} ms"
        for profile, model in engine_fleet(QUALITY_MODELS[sweep.quality], n)
    ]
    score, qos = [0.0] * n, [0.0] * n
    decided = [[0] * IN_FLIGHT_BUCKETS for _ in range(n)]
    sent_at = [[0] * IN_FLIGHT_BUCKETS for _ in range(n)]
    met_at = [[0] * IN_FLIGHT_BUCKETS for _ in range(n)]
    per_episode = []
    for policy in runs:
        for k, seed in enumerate(seeds):
            env = sweep.env(
                k, n=n, rate=rate, latency_ms=latency_ms, on="engines", arrivals=bool(sweep.trace)
            )
            buckets: list[list[int]] = []  # per decision, each engine's bucket
            for i, e, req in episode(env, _watched(policy, buckets), seed):
                score[e] += req.score
                qos[e] += env.qos(req)
                sent_at[e][buckets[i][e]] += 1
                met_at[e][buckets[i][e]] += req.latency_per_token(req.done_at) <= env.L
            for row in buckets:
                for e, b in enumerate(row):
                    decided[e][b] += 1
            per_episode.append(episode_qos(env))
    count, met = [sum(row) for row in sent_at], [sum(row) for row in met_at]
    total = sum(count) or 1
    shares = [
        EngineShare(
            names[e],
            count[e] / total,
            score[e] / count[e] if count[e] else None,
            met[e] / count[e] if count[e] else None,
            qos[e] / count[e] if count[e] else None,
        )
        for e in range(n)
    ]
    by_load = [
        LoadShare(
            names[e],
            bucket_name(b),
            decided[e][b],
            sent_at[e][b] / decided[e][b],
            met_at[e][b] / sent_at[e][b] if sent_at[e][b] else None,
        )
        for e in range(n)
        for b in range(IN_FLIGHT_BUCKETS)
        if decided[e][b]
    ]
    return Measured(shares, by_load, statistics.fmean(per_episode))


def main(
    quick: bool,
    seed: int,
    n_seeds: int,
    json_path: str | None,
    models: dict[str, list[Path]],
    quality: Quality,
    scrape_ms: float | None,
    n: int = 6,
    rate: float = DEFAULT_RATE,
    latency_ms: float = DEFAULT_LATENCY_MS,
    trace: Path | None = None,
    predictor: Path | None = None,
) -> None:
    """Every heuristic of `bench qos` and each agent in `models` (its training runs) at
    one setting on the engines' fleet, on environment seeds `seed` + 100 onwards (as
    `bench qos` numbers them), episodes of 512 decisions (`quick`: 128, and the files
    go to a temporary folder). `trace`: arrivals from a trace (Azure or Mooncake format) instead
    of Poisson ones, environment seed k reading its k-th window at `rate`, as `bench qos`'s
    trace point does. `predictor`: the folder of the predictor every policy reads (as
    `bench qos`'s option)."""
    from workers.quality import default_data_dir

    seeds = [seed + 100 + i for i in range(n_seeds)]
    read_from = run_predictor(quality, predictor, models)
    sweep = Sweep.of(
        quality,
        default_data_dir(),
        read_from,
        trace=timed_trace(trace)[1] if trace is not None else (),
        hardware="engines",
        episode=128 if quick else 512,
        scrape_ms=scrape_ms,
    )
    policies: dict[str, list[Policy]] = {k: [v] for k, v in heuristics(quality, read_from).items()}
    for name, dirs in models.items():
        policies[name] = [served(load(d, latency_ms)) for d in dirs]
    rows: list[dict[str, Any]] = []
    load_rows: list[dict[str, Any]] = []
    for name, runs in policies.items():
        measured = engine_shares(sweep, runs, seeds, n, rate, latency_ms)
        print(f"  {name:<14} QoS {measured.qos:.3f}", flush=True)
        rows += [{"policy": name, **asdict(s), "policy_qos": measured.qos} for s in measured.shares]
        load_rows += [{"policy": name, **asdict(s)} for s in measured.by_load]
    setting = f"_N-{n}_lambda-{rate:g}_L-{latency_ms:g}ms_seed-{seed}_seeds-{n_seeds}"
    setting, trace_flag = trace_named(setting, trace)
    base, scrape_flag = scrape_named("qos_shares" + quality_suffix(quality), scrape_ms)
    base, predictor_flag = predictor_named(base + setting, quality, read_from)
    name, model_flags = agents_named(base, models, {})
    config = {
        "command": f"edgeroute bench qos-shares --quality {quality}{scrape_flag} --n {n} "
        f"--rate {rate:g} --latency-ms {latency_ms:g} --seed {seed} "
        f"--seeds {n_seeds}{trace_flag}{predictor_flag}{model_flags}",
        "quality": quality,
        "seeds": seeds,
        "n": n,
        "rate": rate,
        "latency_ms": latency_ms,
        "scrape_ms": scrape_ms,
        "models": {k: [recorded(d) for d in v] for k, v in models.items()},
    }
    write(
        name,
        config,
        rows,
        COLUMNS,
        json_path,
        quick=quick,
        notes=(
            "Per engine of the live run's fleet: `sent`, the share of the policy's routed "
            "requests it sent there (pooled over seeds and an agent's training runs); "
            "`score`, their mean score; `met`, the share that met L; `qos`, their mean "
            "QoS (eq. 1). `policy_qos`: the policy's mean QoS per episode, drops and "
            "refusals counted 0."
        ),
        plot=Plot(
            x="engine",
            y=("sent", "met", "qos"),
            group=("policy",),
            title=f"where each policy sends requests, N = {n}, lambda = {rate:g}, "
            f"L = {latency_ms:g} ms",
        ),
    )
    by_load = Path(json_path) if json_path else None
    write(
        name + "_by-load",
        config,
        load_rows,
        LOAD_COLUMNS,
        None if by_load is None else str(by_load.with_name(f"{by_load.stem}_by-load.json")),
        quick=quick,
        notes=(
            "Per engine and count of requests it held (running and waiting) as a request "
            "arrived, in buckets: `decisions`, the policy's arrivals decided with the "
            "engine at that count (every arrival counts once per engine, drops and "
            "refusals included); `sent`, the share of them sent to it; `met`, the share "
            "of those that met L."
        ),
    )
