"""The QoS comparison through the real gateway: `edgeroute bench qos --live`.

Six emulated workers (time-scaled) serve the six open RouterBench models behind one
alias (or, with `quality` routerdc, answer as six of RouterDC's models on the same six
hardware profiles); another number of engines cycles the profiles and the models
(`edgeroute.sim.edge.engine_fleet`, as the simulator's `live engines` has them). Real
prompts of the evaluation split (which neither the predictor nor the agent trained
on) arrive by a Poisson process (the same prompts and instants for every policy).
The workers and the client share one event loop; the gateway runs in a process of
its own. QoS per request is the worker's reported ground-truth score
(`x-emulated-score`) times [latency per token <= L], with latency measured by the
client in emulated seconds; a shed request (503) scores 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import math
import random
import statistics
import subprocess
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import httpx

from edgeroute.bench.live import gateway_clock
from edgeroute.bench.loadgen import paced, percentile
from edgeroute.bench.overhead import GATEWAY_CPU, ServerExited, start_gateway
from edgeroute.qos.config import (
    DEFAULT_LATENCY_MS,
    DEFAULT_RATE,
    Serving,
    best_predicted,
    quality_flag,
    quality_suffix,
)
from edgeroute.results_io import recorded, write
from edgeroute.sim.edge import QUALITY_MODELS, Quality, Task, engine_fleet, load_tasks
from edgeroute.stats import paired, paired_each, shown
from gateway.ports import free_ports
from gateway.serving import Listener, make_server
from gateway.settings import Settings
from workers.profiles import EXPERTS
from workers.server import Worker, WorkerConfig

ALIAS = "edge"
_DEFAULTS = Settings.model_fields
# The gateway's default scrape of the engines' metrics, in emulated ms: time-scaled
# like every other interval of the run.
SCRAPE_MS = float(_DEFAULTS["scrape_interval"].default) * 1000
# How much faster than wall time the engines' clock runs. The emulated engines, the
# client and their HTTP share one core, and the faster the clock the more their own
# work can show in the engines' latencies: at N = 12 and lambda = 10, round-robin's
# seconds per token on one seed came out 9% above the simulator's at x10, 3% at x5 and
# 0.4% at x2, but over 20 seeds x5 was no faster than x10 (docs/research.md, "The
# harness's own slowness").
SPEEDUP = 10.0
PROMPTS = {"routerbench": "MBPP prompts", "routerdc": "RouterDC's free-form prompts"}


def fleet_words(quality: Quality, engines: int) -> str:
    """The results' words for the workers, up to the closing bracket."""
    if engines != len(EXPERTS):
        return (
            f"{engines} emulated workers (the six hardware profiles of RouterBench's open "
            f"models and the {quality} world's {len(QUALITY_MODELS[quality])} models, "
            f"each cycled, {PROMPTS[quality]}"
        )
    if quality == "routerbench":
        return f"six emulated workers (the six open RouterBench models, {PROMPTS[quality]}"
    return (
        "six emulated workers (the six hardware profiles of RouterBench's open models, "
        f"answering as the first six of RouterDC's models, {PROMPTS[quality]}"
    )


async def run_policy(
    spec: dict[str, Any],
    prompts: list[str],
    gaps: list[float],
    speedup: float,
    latency: float,
    data_dir: Path,
    quality: Quality = "routerbench",
    scrape_ms: float = SCRAPE_MS,
    max_batch: int | None = None,
    engines: int = len(EXPERTS),
) -> dict[str, Any]:
    """`engines` workers, `edgeroute.sim.edge.engine_fleet`'s: with `quality`
    routerbench the first six are their RouterBench model's profile; with routerdc
    the same hardware answers as RouterDC's models in turn. `max_batch`: each engine
    runs at most that many requests at once (the paper's edge experts: 5), else its
    profile's limit."""
    # Each serves its model under the model's full name, as a vLLM server does, so that
    # the gateway's predictor knows it.
    fleet = engine_fleet(QUALITY_MODELS[quality], engines)
    port, *worker_ports = free_ports(1 + engines)
    workers = [
        Worker(
            WorkerConfig(
                profile=profile,
                served_model_names=[model, ALIAS],
                answers_as=model,
                port=worker_ports[i],
                speedup=speedup,
                data_dir=data_dir,
                overrides={} if max_batch is None else {"max_batch": max_batch},
            )
        )
        for i, (profile, model) in enumerate(fleet)
    ]
    servers = [make_server(Listener(w.app, "127.0.0.1", w.config.port)) for w in workers]
    tasks = [asyncio.create_task(s.serve()) for s in servers]
    while not all(s.started for s in servers):
        await asyncio.sleep(0.05)
    # The gateway runs in its own process, on its own CPU: the emulated engines share
    # this event loop, and a policy's decisions must not stall them (engines on GPUs do
    # not wait for the router), which would make a costlier policy's world slower.
    # Each backend's batch cap is its engine's, as an operator configures it (vLLM's
    # --max-num-seqs): the QoS policy splits an engine's requests into running and
    # waiting by it.
    backends = [
        {
            "url": f"http://127.0.0.1:{w.config.port}",
            "id": engine_id(w.config.profile, i),
            "profile": {"max_batch": w.profile.max_batch},
        }
        for i, w in enumerate(workers)
    ]
    lags: list[float] = []
    late: list[float] = []
    try:
        gateway = await started_gateway(
            port,
            backends,
            str(spec["policy"]),
            routing={"default": spec},
            scrape_interval=scrape_ms / 1000 / speedup,
            max_inflight=_DEFAULTS["max_inflight"].default,  # the gateway's own admission limit
        )
        lag_task = asyncio.create_task(loop_lag(lags))
        try:
            await asyncio.sleep(0.3)  # a few scrapes of the engines' load
            with collector_paused():
                results = await replay(gateway.port, prompts, gaps, speedup, late)
            queried = sum(w.engine.stats.prefix_queries for w in workers)
            computed = sum(w.engine.stats.prompt_tokens for w in workers)
        finally:
            lag_task.cancel()
            gateway.process.terminate()
            await asyncio.to_thread(gateway.process.wait, 10)
    finally:  # the engines stop too when no gateway would start
        for s in servers:
            s.should_exit = True
        await asyncio.gather(*tasks)
    served = [r for r in results if r[2] == ANSWERED]
    answered_by = Counter(r[3] for r in served if r[3])
    return {
        "qos": statistics.fmean(s * (lat <= latency) for s, lat, _, _ in results),
        "latency_ms": statistics.fmean(r[1] for r in served) * 1e3 if served else None,
        "drop_rate": sum(r[2] == SHED for r in results) / len(results),
        "errors": sum(r[2] == FAILED for r in results),
        "met_share": sum(r[1] <= latency for r in results) / len(results),
        "requests": len(results),
        # what a bad run is made of: the policy's routing (all on one engine) or the
        # harness (the engines' event loop falling behind, in emulated ms)
        "busiest_share": max(answered_by.values()) / len(served) if answered_by else None,
        # which engines answered, and how good their answers were whatever their latency:
        # a policy that meets L but scores less picked weaker models
        "engine_shares": {e: n / len(served) for e, n in sorted(answered_by.items())},
        "answered_score": statistics.fmean(r[0] for r in served) if served else None,
        "loop_lag_ms": percentile(lags, 99) * speedup * 1e3 if lags else None,
        # how late the client sent: the arrival process the engines really saw
        "send_late_ms": percentile(late, 99) * speedup * 1e3 if late else None,
        # the prompt tokens the engines' prefix caches skipped (`bench qos-replay`'s
        # `prefill_skipped`, simulated)
        "prefill_skipped": 1 - computed / queried if queried else None,
    }


class Gateway(NamedTuple):
    process: subprocess.Popen[bytes]
    port: int


async def started_gateway(
    port: int, backends: list[dict[str, Any]], target: str, attempts: int = 3, **settings: Any
) -> Gateway:
    """`overhead.start_gateway` on `port`, or, if the gateway exits before it is ready,
    on another free port, up to `attempts` times. A port found free can be taken by
    another socket before the gateway binds it (another process's server drawing the
    same), and one lost start-up must not end a run of hours."""
    for _ in range(attempts - 1):
        try:
            process = await asyncio.to_thread(start_gateway, port, backends, target, **settings)
            return Gateway(process, port)
        except ServerExited as exc:
            print(f"  the gateway did not start ({exc}); again on another port", flush=True)
            port = free_ports(1)[0]
    process = await asyncio.to_thread(start_gateway, port, backends, target, **settings)
    return Gateway(process, port)


ANSWERED, SHED, FAILED = 0, 1, 2

# How the client keeps the instants, recorded with each run (`qos_pool` pools only
# runs alike): "paced", each send aimed at its own instant. Runs recorded before
# 2026-11-30 (late morning) have none: they slept each gap in turn, and every
# wake-up's overshoot (about 0.6 ms of wall time, 6 emulated ms) delayed all later
# sends, so their engines saw 3-5% fewer arrivals per second than the rate they name.
ARRIVALS = "paced"


def engine_id(profile: str, i: int) -> str:
    """The i-th engine's backend id: its profile's name, numbered from the second
    round of the profiles on (`profile-2`, ...)."""
    round_ = i // len(EXPERTS)
    return profile if round_ == 0 else f"{profile}-{round_ + 1}"


def engine_models(quality: Quality, engines: int) -> dict[str, str]:
    """Each engine's backend id (named after its hardware profile) and the model it
    answers as: the key to a run's `engine_shares`."""
    fleet = engine_fleet(QUALITY_MODELS[quality], engines)
    return {engine_id(profile, i): model for i, (profile, model) in enumerate(fleet)}


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """This process's garbage collector off for an episode, and a collection after it.
    The emulated engines share the process with the client and the data they answer
    from, and a full collection of that heap took about 100 ms of wall time, once or
    twice an episode: every engine stopped at once for 0.5-1 emulated s, which real
    engines never do for their clients' collector. Reference counting still frees
    all but cycles; an episode's cycles wait for its end."""
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
        gc.collect()


async def loop_lag(lags: list[float], period: float = 0.005) -> None:
    """How late this event loop (the emulated engines' and the client's) wakes from a
    `period` sleep, appended to `lags` (s) until cancelled."""
    while True:
        t0 = time.perf_counter()
        await asyncio.sleep(period)
        lags.append(time.perf_counter() - t0 - period)


async def replay(
    port: int, prompts: list[str], gaps: list[float], speedup: float, late: list[float]
) -> list[tuple[float, float, int, str]]:
    """Each prompt at its instant (`loadgen.paced`), how late each was sent appended to
    `late` (wall s); (score, latency per token, outcome, backend) per request: a
    request the connection failed under scores 0 and is counted as an error, not lost."""
    results: list[tuple[float, float, int, str]] = []

    async def one(client: httpx.AsyncClient, prompt: str) -> None:
        t0 = time.perf_counter()
        try:
            r = await client.post(
                "/v1/chat/completions",
                json={"model": ALIAS, "messages": [{"role": "user", "content": prompt}]},
            )
        except httpx.TransportError:
            results.append((0.0, float("inf"), FAILED, ""))
            return
        if r.status_code != 200:
            results.append((0.0, float("inf"), SHED, ""))
            return
        tokens = max(1, r.json()["usage"]["completion_tokens"])
        per_token = (time.perf_counter() - t0) * speedup / tokens
        backend = r.headers.get("x-edgeroute-backend", "")
        results.append((float(r.headers["x-emulated-score"]), per_token, ANSWERED, backend))

    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=300) as client:
        pending = []
        instants = [t / speedup for t in itertools.accumulate(gaps)]
        sends = paced(instants)
        for prompt, _ in zip(prompts, instants, strict=True):
            late.append(await anext(sends))
            pending.append(asyncio.create_task(one(client, prompt)))
        await asyncio.gather(*pending)
    return results


def named(
    quality: Quality,
    scrape_ms: float,
    models: dict[str, list[Path]],
    max_batch: int | None = None,
    serving: Serving | None = None,
    rate: float = DEFAULT_RATE,
    first_seed: int = 1,
    latency_ms: float = DEFAULT_LATENCY_MS,
    engines: int = len(EXPERTS),
    speedup: float = SPEEDUP,
    predictor: tuple[str, str] = ("", ""),
) -> tuple[str, str]:
    """The results' name and the command's flags beyond --quality: a scrape other than
    the default, engines with another batch limit, another number of engines, another
    arrival rate, another latency target or another time scale (the emulation's
    fidelity) are another world, agents given by hand
    are other agents, and other seeds other samples, so each gets results of its own
    rather than overwriting the committed ones."""
    from edgeroute.bench.qos import agents_named, scrape_named, variant_named

    base, flags = scrape_named(
        "qos_live" + quality_suffix(quality), None if scrape_ms == SCRAPE_MS else scrape_ms
    )
    if max_batch is not None:
        base += f"_batch-{max_batch}"
        flags += f" --max-batch {max_batch}"
    if engines != len(EXPERTS):
        base += f"_engines-{engines}"
        flags += f" --engines {engines}"
    if rate != DEFAULT_RATE:
        base += f"_rate-{rate:g}"
        flags += f" --rate {rate:g}"
    if latency_ms != DEFAULT_LATENCY_MS:
        base += f"_L-{latency_ms:g}ms"
        flags += f" --latency-ms {latency_ms:g}"
    if speedup != SPEEDUP:
        base += f"_x{speedup:g}"
        flags += f" --speedup {speedup:g}"
    base, seed_flags = variant_named(base, first_seed)
    suffix, predictor_flag = predictor  # (`edgeroute.bench.qos.predictor_named`)
    name, model_flags = agents_named(base + suffix, models, serving)
    return name, flags + seed_flags + predictor_flag + model_flags


# The results table's columns, in order.
COLUMNS = [
    "policy",
    "qos_ci",
    "minus_least_load",
    "paired_minus_agents",
    "met_share_ci",
    "drop_rate",
    "latency_ms",
    "requests",
    "errors",
    "busiest_share",
    "answered_score",
    "worst_loop_lag_ms",
    "worst_send_late_ms",
    "prefill_skipped",
    "by_run_qos",
]


def served_run(k: int, runs: int) -> int:
    """The training run (of `runs`) that serves the `k`-th seed of a live run."""
    return k % runs


def by_run(rows: list[dict[str, Any]]) -> dict[int, float]:
    """Mean QoS per training run over the seeds each served, in run order: what each
    of an agent's runs (or students) did live. Empty for a policy without runs."""
    served: dict[int, list[float]] = {}
    for r in rows:
        if r.get("run") is not None:
            served.setdefault(r["run"], []).append(r["qos"])
    return {run: statistics.fmean(q) for run, q in sorted(served.items())}


def summarise(rows: list[dict[str, Any]], agents: list[str]) -> list[dict[str, Any]]:
    """One row per policy from the per-seed `rows` (seed, policy, its run's figures):
    intervals over seeds, each policy minus least-load seed by seed, and the first of
    `agents` minus each other agent seed by seed."""
    summary: list[dict[str, Any]] = []
    reference = {r["seed"]: r["qos"] for r in rows if r["policy"] == "least_load"}
    for name in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == name]
        summary.append(
            {
                "policy": name,
                "qos_ci": shown([r["qos"] for r in mine]),
                "minus_least_load": paired(
                    [r["qos"] for r in mine], [reference[r["seed"]] for r in mine]
                )
                if name != "least_load"
                else "",
                "met_share_ci": shown([r["met_share"] for r in mine]),
                "drop_rate": statistics.fmean(r["drop_rate"] for r in mine),
                "latency_ms": statistics.fmean(r["latency_ms"] or math.nan for r in mine),
                "requests": sum(r["requests"] for r in mine),
                "errors": sum(r["errors"] for r in mine),
                "busiest_share": statistics.fmean(r["busiest_share"] or 0.0 for r in mine),
                "answered_score": _mean(r.get("answered_score") for r in mine),
                "worst_loop_lag_ms": max(r["loop_lag_ms"] or 0.0 for r in mine),
                "worst_send_late_ms": max(r.get("send_late_ms") or 0.0 for r in mine),
                "prefill_skipped": _mean((r.get("prefill_skipped") for r in mine), ".0%"),
                "by_run_qos": ", ".join(f"{q:.3f}" for q in by_run(mine).values()),
                "per_seed_qos": [r["qos"] for r in mine],
                "per_seed_drop_rate": [r["drop_rate"] for r in mine],
                "per_seed_met_share": [r["met_share"] for r in mine],
                "per_seed_busiest_share": [r["busiest_share"] for r in mine],
                "per_seed_loop_lag_ms": [r["loop_lag_ms"] for r in mine],
                "per_seed_send_late_ms": [r.get("send_late_ms") for r in mine],
                "per_seed_prefill_skipped": [r.get("prefill_skipped") for r in mine],
                "per_seed_run": [r.get("run") for r in mine],
                "per_seed_answered_score": [r.get("answered_score") for r in mine],
                "per_seed_engine_shares": [r.get("engine_shares") for r in mine],
            }
        )
    learned = [r for r in summary if r["policy"] in agents]
    if len(learned) > 1:  # the first agent against each other, on the same seeds' requests
        learned[0]["paired_minus_agents"] = paired_each(
            learned[0]["per_seed_qos"], {r["policy"]: r["per_seed_qos"] for r in learned[1:]}
        )
    return summary


def _mean(values: Iterator[float | None], spec: str = ".3f") -> str:
    """A mean over seeds formatted by `spec`, or "" where a run did not record it."""
    known = [v for v in values if v is not None]
    return format(statistics.fmean(known), spec) if known else ""


def live_stream(
    pool: Sequence[Task], seed: int, requests: int, rate: float
) -> tuple[list[Task], list[float]]:
    """One seed's requests: prompts drawn from `pool` with replacement, and the gaps
    before each (Poisson at `rate` per emulated second). `bench qos-replay` rebuilds a
    live run's streams with it."""
    rng = random.Random(seed)
    tasks = [rng.choice(pool) for _ in range(requests)]
    return tasks, [rng.expovariate(rate) for _ in range(requests)]


class LivePlan(NamedTuple):
    """A live run settled before it starts: its results' name, the config its results
    file records (what `bench qos-replay` and `bench qos --live --predict` read), each
    agent's training runs, and how they are served."""

    name: str
    config: dict[str, Any]
    models: dict[str, list[Path]]
    serving: Serving
    quick: bool


def plan(
    quick: bool,
    seed: int,
    models: dict[str, list[Path]],
    requests: int = 1000,
    rate: float = DEFAULT_RATE,
    speedup: float = SPEEDUP,
    latency_ms: float = DEFAULT_LATENCY_MS,
    n_seeds: int = 3,
    quality: Quality = "routerbench",
    scrape_ms: float | None = None,
    max_batch: int | None = None,
    serving: Serving | None = None,
    engines: int | None = None,
    predictor: Path | None = None,
) -> LivePlan:
    """The live run these settings give (`main` runs it). `models` (none: the quality
    world's trained runs), `max_batch`, `engines` (None: six): see `run_policy`.
    `serving`: agents served with other parameters (`shed: false`, `sample: true`,
    `speed_prior: true`). `predictor`: the folder of the predictor BR reads (by
    default the world's; agents must have trained with it)."""
    from edgeroute.bench.qos import (
        check_serving,
        predictor_named,
        refuse_other_serving,
        run_predictor,
        trained_runs,
    )

    scrape_ms = SCRAPE_MS if scrape_ms is None else scrape_ms
    engines = len(EXPERTS) if engines is None else engines
    serving = serving or {}
    check_serving(models, serving)
    given, models = models, models or trained_runs(quality)
    folder = run_predictor(quality, predictor, models)
    predictor_name = predictor_named("", quality, folder)
    name, flags = named(
        quality,
        scrape_ms,
        given,
        max_batch,
        serving,
        rate,
        seed,
        latency_ms,
        engines,
        speedup,
        predictor_name,
    )
    refuse_other_serving(name, serving, quick)
    config = {
        "command": "edgeroute bench qos --live"
        + (" --quick" if quick else f" --seeds {n_seeds}")
        + quality_flag(quality)
        + flags,
        "quality": quality,
        "seeds": [seed + i for i in range(1 if quick else n_seeds)],
        "requests_per_seed": min(requests, 100) if quick else requests,
        "rate": rate,
        "speedup": speedup,
        "latency_ms": latency_ms,
        "scrape_ms": scrape_ms,
        "max_batch": max_batch,
        "engines": engines,
        "arrivals": ARRIVALS,
        "models": {k: [recorded(d) for d in v] for k, v in models.items()},
    }
    if predictor_name[0]:  # not the world's
        config["predictor"] = recorded(folder)
    return LivePlan(name, config, models, serving, quick)


def recorded_predictor(config: dict[str, Any]) -> Path | None:
    """The folder of the predictor a live run's policies read, when its config names
    one other than its world's."""
    folder = config.get("predictor")
    return None if folder is None else Path(folder)


def main(run: LivePlan, json_path: str | None) -> None:
    """RR, least-load (the engines' own queues: SQF), BR (`best_predicted`, with the
    world's predictor) and each agent, on the same prompts and instants per seed; seed k
    is served by an agent's training run k (modulo its number of runs)."""
    from workers.quality import default_data_dir

    data_dir = default_data_dir()
    c = run.config
    quality: Quality = c["quality"]
    requests, rate, speedup = c["requests_per_seed"], c["rate"], c["speedup"]
    latency_ms, scrape_ms, max_batch = c["latency_ms"], c["scrape_ms"], c["max_batch"]
    engines = c["engines"]
    pool = load_tasks(data_dir, split="eval", quality=quality)
    rows: list[dict[str, Any]] = []
    for k, one_seed in enumerate(c["seeds"]):
        tasks, gaps = live_stream(pool, one_seed, requests, rate)
        served = {name: served_run(k, len(runs)) for name, runs in run.models.items()}
        prompts = [t.prompt for t in tasks]
        specs: dict[str, dict[str, Any]] = {
            "RR": {"policy": "round_robin"},
            "least_load": {"policy": "least_load"},
            "BR": best_predicted(quality, recorded_predictor(c)),  # load aside
        }
        for name, runs in run.models.items():
            spec: dict[str, Any] = {"policy": "qos_drl", "model": str(runs[served[name]])}
            if name in run.serving:
                spec["params"] = dict(run.serving[name])
            specs[name] = gateway_clock(spec, latency_ms / 1000, speedup)
        for name, spec in specs.items():
            r = asyncio.run(
                run_policy(
                    spec,
                    prompts,
                    gaps,
                    speedup,
                    latency_ms / 1000,
                    data_dir,
                    quality,
                    scrape_ms,
                    max_batch,
                    engines,
                )
            )
            rows.append({"seed": one_seed, "policy": name, "run": served.get(name), **r})
            print(
                f"  seed {one_seed} {name:<10} QoS {r['qos']:.3f}  met L {r['met_share']:.1%}  "
                f"drops {r['drop_rate']:.1%}  busiest {r['busiest_share'] or 0:.0%}  "
                f"loop lag p99 {r['loop_lag_ms'] or 0:.0f} ms  "
                f"sent late p99 {r['send_late_ms'] or 0:.0f} ms"
                + (f"  errors {r['errors']}" if r["errors"] else ""),
                flush=True,
            )
    summary = summarise(rows, list(run.models))
    write(
        run.name,
        c,
        summary,
        COLUMNS,
        json_path,
        notes=(
            f"Through the gateway (a process of its own, on CPU {GATEWAY_CPU}): "
            + fleet_words(quality, engines)
            + f", time-scaled x{speedup:g}, in the client's "
            f"process), {requests} evaluation-split prompts per seed "
            f"arriving at {rate:g}/s (Poisson; the same for every policy), L = "
            f"{latency_ms:g} ms, engines' metrics scraped every {scrape_ms:g} emulated ms"
            + (
                ". "
                if max_batch is None
                else f", each engine running at most {max_batch} requests at once "
                "(the paper's edge experts' running slots; their waiting queue is not "
                "capped). "
            )
            + "QoS per request is the worker's reported score times "
            "[latency per token <= L], latency measured by the client; a shed request "
            "scores 0, and so does one whose connection failed (`errors`). `met_share`: requests answered within L. `minus_least_load`: the "
            "QoS difference from least-load, paired by seed. Intervals are over the "
            "seeds; seed k is served by an agent's training run k (modulo its runs); "
            "`by_run_qos`: an agent's mean QoS over the seeds each of its runs served, "
            "in run order. "
            "`busiest_share`: the share of answers from the engine that gave most, "
            "averaged over seeds; `answered_score`: the mean score of the answers, whatever "
            "their latency, averaged over seeds (which models a policy picked; each "
            "seed's share per engine is in the JSON); `worst_loop_lag_ms`: the highest over seeds of the p99 "
            "of how late the engines' event loop woke (emulated ms): a run where it is "
            "large measured the harness, not the policy; `worst_send_late_ms`: the "
            "highest over seeds of the p99 of how late the client sent a request after "
            "its instant (emulated ms; each send aims at its own instant, so lateness "
            "does not add up); `prefill_skipped`: the share of prompt tokens whose "
            "prefill the engines' prefix caches skipped, averaged over seeds. "
            "The engines (backend id: the model it answers as): "
            + ", ".join(
                f"`{e}`: {m.rsplit('/', 1)[-1]}" for e, m in engine_models(quality, engines).items()
            )
            + "."
        ),
        quick=run.quick,
    )
