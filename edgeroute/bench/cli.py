"""`edgeroute bench ...` subcommands."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from edgeroute.qos.config import DEFAULT_LATENCY_MS, DEFAULT_RATE, QUALITIES
from edgeroute.qos.rollout import Lookahead
from edgeroute.sim.edge import Fleet, check_range

if TYPE_CHECKING:
    from edgeroute.bench.qos import Hardware, Physics
    from edgeroute.bench.qos_replay import Lateness

_N = TypeVar("_N", int, float)


def positive_range(text: str) -> tuple[float, float]:
    """`--latencies LO,HI`, `--hardware-ms LO,HI` (ms), `--latency-over-fastest LO,HI`
    (factors): a range with 0 < LO <= HI."""
    try:
        low, high = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO,HI, not {text!r}") from None
    try:
        check_range((low, high), "LO,HI")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return low, high


def experts_range(text: str) -> tuple[int, int]:
    """`--experts-range LO,HI`: two whole numbers of experts (`TrainConfig` checks
    that 1 <= LO <= HI)."""
    try:
        low, high = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole numbers LO,HI, not {text!r}") from None
    return low, high


def add_fleet_options(p: argparse.ArgumentParser) -> None:
    """How the simulated experts are drawn (`edgeroute.sim.edge.Fleet`): the same options
    for `train qos`, `bench qos` and `bench qos-impact`, so an agent is measured in the
    world it trained in."""
    f = Fleet()
    p.add_argument(
        "--hardware-ms",
        type=positive_range,
        default=f.hardware_ms,
        metavar="LO,HI",
        help="the range the experts' base ms per iteration is drawn from",
    )
    p.add_argument(
        "--running-cap",
        type=int,
        default=f.running_cap,
        metavar="N",
        help="requests an expert runs at once (the paper's 5; live engines: 256)",
    )
    p.add_argument(
        "--memory-tokens",
        type=int,
        default=f.memory_tokens,
        metavar="N",
        help="every expert's KV memory in tokens; default: each hardware seed's own (2-6K)",
    )
    p.add_argument(
        "--waiting-cap",
        type=int,
        default=f.waiting_cap,
        metavar="N",
        help="requests an expert holds waiting before it refuses more (the paper's 5; a "
        "large N: engines that never refuse, as live ones)",
    )


def fleet_from(args: argparse.Namespace) -> Fleet:
    return Fleet(
        hardware_ms=args.hardware_ms,
        running_cap=args.running_cap,
        waiting_cap=args.waiting_cap,
        memory_tokens=args.memory_tokens,
    )


def _positive(text: str, unit: str, symbol: str, kind: Callable[[str], _N]) -> _N:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {unit}, not {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected {symbol} > 0, not {text!r}")
    return value


def positive_ms(text: str) -> float:
    """`--scrape-ms MS` (of `bench qos` and `train qos`) or `--latency-ms MS` (of `bench
    qos --live`): a span in ms, MS > 0."""
    return _positive(text, "ms", "MS", float)


def positive_rate(text: str) -> float:
    """`--rate RATE` (of `bench qos --live`): requests per second, RATE > 0."""
    return _positive(text, "requests per second", "RATE", float)


def positive_factor(text: str) -> float:
    """`--speedup X` (of `bench qos --live`) or `--time-scale X` (of a simulated `bench
    qos`): a factor, X > 0."""
    return _positive(text, "a factor", "X", float)


def positive_rates(text: str) -> list[float]:
    """`--rates R1,R2,...` (of `bench qos-rollout`): requests per second, each > 0."""
    return [positive_rate(part) for part in text.split(",")]


def positive_int(text: str) -> int:
    """`--seeds N` or `--engines N` (of `bench qos`): a count, N > 0."""
    return _positive(text, "a whole number", "N", int)


def engine_episode_options(
    p: argparse.ArgumentParser, quality: str, model_required: bool = False
) -> None:
    """The options of a benchmark of episodes on the live run's engines (`qos-shares`,
    `qos-rollout`): the run's size and seeds, its agents, the quality world (by default
    `quality`) and the scrape."""
    p.add_argument("--quick", action="store_true", help="short episodes, files to a temp folder")
    p.add_argument("--seed", type=int, default=1, help="seeds from this one + 100, as bench qos")
    p.add_argument("--seeds", type=positive_int, default=10, help="environment seeds")
    p.add_argument("--json", help="also write the results as JSON here")
    p.add_argument(
        "--model",
        action="append",
        default=[],
        required=model_required,
        metavar="NAME=DIR[,DIR...]",
        help="an agent's training runs, served by their argmax; repeatable",
    )
    p.add_argument("--quality", choices=QUALITIES, default=quality, help="the quality world")
    p.add_argument(
        "--scrape-ms",
        type=positive_ms,
        help="the policies see the engines from scrapes this many ms apart (default: exactly)",
    )


def add_predictor_option(p: argparse.ArgumentParser) -> None:
    """`--predictor DIR` (of `bench qos`, `qos-impact` and `qos-shares`)."""
    p.add_argument(
        "--predictor",
        type=Path,
        help="the folder of the predictor every policy reads (default: the quality "
        "world's); agents must have trained with it",
    )


class DefaultsHelp(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's default in its help line, unless the help already names it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.help and "default" in action.help:
            return action.help
        return super()._get_help_string(action)


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    bench = sub.add_parser("bench", help="run a benchmark; prints a table, writes results")
    subs = bench.add_subparsers(dest="benchmark", required=True)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        """A benchmark's parser; its --help shows every option's default."""
        formatter = argparse.ArgumentDefaultsHelpFormatter
        parser: argparse.ArgumentParser = subs.add_parser(
            name, help=help, formatter_class=formatter
        )
        return parser

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--quick", action="store_true", help="a small run (< 2 min)")
        p.add_argument("--seed", type=int, default=1, help="the first seed of the run")
        p.add_argument("--json", help="also write the results as JSON here")

    p = command("policies", help="decision time per policy for 8/64/512 backends")
    common(p)
    p.set_defaults(func=lambda a: _policies(a))
    i = command(
        "idle",
        help="the QoS decision after the core idled (with and without warm-ups) or its caches were evicted",
    )
    common(i)
    i.set_defaults(func=lambda a: _idle(a))
    o = command("overhead", help="what the gateway adds in front of a fast backend")
    common(o)
    o.add_argument(
        "--policies",
        default="least_load,cla,netkv_full,qos_drl,qos_drl@warm,least_load@asyncio,least_load@h11",
        help="targets: a policy, or policy@asyncio / policy@h11 for the loop or parser, "
        "policy@warm for keep_warm_ms",
    )
    o.set_defaults(func=lambda a: _overhead(a))
    rl = command("reload", help="what a routing change costs the requests in flight")
    common(rl)
    rl.set_defaults(func=lambda a: _reload(a))
    ab = command(
        "overhead-ab", help="the gateway's overhead from two checkouts, alternated in pairs"
    )
    ab.add_argument("--before", required=True, type=Path, help="the older checkout")
    ab.add_argument("--after", default=Path("."), type=Path, help="the newer checkout")
    ab.add_argument("--pairs", type=int, default=10, help="before/after pairs to measure")
    ab.add_argument("--seconds", type=float, default=5.0, help="per measurement phase")
    ab.add_argument("--name", default="overhead_ab", help="the results files' name")
    ab.add_argument("--json", help="also write the results as JSON here")
    ab.add_argument(
        "--phase",
        choices=("least-load", "qos-full-queues"),
        default="least-load",
        help="what to measure: the gateway's added latency and CPU with least_load, or "
        "qos_drl's decisions with full queues (bench overhead's second phase)",
    )
    ab.set_defaults(func=lambda a: _overhead_ab(a))
    n = command("netkv", help="NetKV's experiments 1, 2, 3, 4 and 6 on the simulator")
    common(n)
    n.add_argument("--seeds", type=int, default=5, help="seeds per point (--quick: 1)")
    n.add_argument(
        "--live",
        action="store_true",
        help="through the gateway: prefill/decode workers on a network of their own, "
        "congestion from the operator's telemetry (bench live's pd-net pool)",
    )
    n.add_argument("--trace", help="Mooncake-format trace (default: the data folder's)")
    n.add_argument(
        "--profile",
        default="rag",
        choices=["chatbot", "rag", "long"],
        help="the workload's request shape",
    )
    n.set_defaults(func=lambda a: _netkv(a))
    pz = command("prism", help="Prism against the MoE placement baselines")
    common(pz)
    pz.add_argument(
        "--mix",
        default="all",
        help="the servers' task mix: all, real, specialised, blended, uniform, or a JSON "
        "file with one {task: weight} object per server (default: all four)",
    )
    pz.add_argument(
        "--seeds", type=int, help="seeds per point (default 5, with --live 10; --quick: 1)"
    )
    pz.add_argument(
        "--live",
        action="store_true",
        help="through the gateway: MoE workers, the scheduler on its own (10 seeds)",
    )
    pz.add_argument(
        "--arrival",
        type=float,
        nargs="+",
        default=[10.0, 20.0],
        help="mean seconds between a server's requests (one run per value)",
    )
    pz.set_defaults(func=lambda a: _prism(a))
    od = command("odmoe", help="OD-MoE shadow recall by precision/alignment, decode speed")
    common(od)
    od.set_defaults(func=lambda a: _odmoe(a))
    q = command("qos", help="the QoS router against BR, RR and SQF, with sweeps")
    common(q)
    q.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME=DIR[,DIR...]",
        help="an agent's training runs (folders with actor.onnx), repeatable; "
        "default: every run in the quality's runs/",
    )
    q.add_argument(
        "--no-shed",
        action="append",
        default=[],
        metavar="NAME",
        help="serve the agent NAME (given with --model) with shed: false: it routes to "
        "its most likely backend where it would drop; repeatable",
    )
    q.add_argument(
        "--sample",
        action="append",
        default=[],
        metavar="NAME",
        help="serve the agent NAME (given with --model) with sample: true: it acts by a "
        "draw from its actor's distribution rather than its most likely action; repeatable",
    )
    q.add_argument(
        "--speed-prior",
        action="append",
        default=[],
        metavar="NAME",
        help="serve the agent NAME (given with --model) with speed_prior: true: a backend "
        "that has finished no request yet is read at the mean speed of those that have; "
        "repeatable",
    )
    q.add_argument(
        "--trace",
        help="a trace for the trace point (Azure CSV or Mooncake JSONL: their instants "
        "rescaled to 5/s, their token counts; default: the data folder's Azure "
        "conversation trace), labelled by its format",
    )
    q.add_argument(
        "--quality",
        choices=QUALITIES,
        default=QUALITIES[0],
        help="the quality data (RouterBench's MBPP, or RouterDC's graded tasks); its "
        "predictor and runs are in models/qos or models/qos/routerdc",
    )
    add_predictor_option(q)
    q.add_argument(
        "--live",
        action="store_true",
        help="instead, compare through the real gateway with emulated workers (6, or --engines)",
    )
    q.add_argument(
        "--predict",
        action="store_true",
        help="with --live: do not run it; run its own request streams, engines, scrape and "
        "agents in the simulator (under --time-scale and --prefix-cache) and write the "
        "prediction as results of its own, to commit before the run",
    )
    q.add_argument(
        "--requests", type=int, default=1000, help="with --live: requests per seed and policy"
    )
    q.add_argument(
        "--seeds",
        type=positive_int,
        help="environment seeds: live, 3 by default; in simulation, per point, 10 by "
        "default (1 with --quick), another number writes results of its own",
    )
    q.add_argument(
        "--rate",
        type=positive_rate,
        help="with --live: requests per second (Poisson; default the paper's 5); "
        "results of their own",
    )
    q.add_argument(
        "--latency-ms",
        type=positive_ms,
        help="with --live: the latency target L per output token, in emulated ms (default "
        "the paper's 30); results of their own",
    )
    q.add_argument(
        "--scrape-ms",
        type=positive_ms,
        help="the gateway's scrape of the engines' metrics, in (emulated) ms; in simulation "
        "the policies then see the experts as the gateway does (default: exactly), live "
        "the gateway scrapes so (default: its own); results of their own",
    )
    add_hardware_options(q)
    add_physics_options(q)
    add_lateness_options(q)
    q.add_argument(
        "--speedup",
        type=positive_factor,
        help="with --live: run the emulated engines' clock this many times faster than "
        "wall time (default 10; slower is more faithful and takes longer); results of "
        "their own",
    )
    q.add_argument(
        "--engines",
        type=positive_int,
        help="with --live: this many emulated engines, cycling the six profiles and the "
        "quality world's models (sim.edge.engine_fleet; default 6); results of their own",
    )
    q.add_argument(
        "--max-batch",
        type=int,
        help="with --live: each emulated engine runs at most this many requests at once "
        "(the paper's edge experts: 5; default: the profiles' own, 256); results of their own",
    )
    add_fleet_options(q)
    q.set_defaults(func=lambda a: _qos(a))
    qi = command("qos-impact", help="eq. 15's impact estimate against the true impact")
    common(qi)
    qi.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="an agent whose trajectory is measured, repeatable; default: the quality's "
        "full and dsa run 0",
    )
    qi.add_argument("--quality", choices=QUALITIES, default=QUALITIES[0], help="the quality world")
    add_fleet_options(qi)
    add_hardware_options(qi)
    qi.add_argument(
        "--scrape-ms",
        type=positive_ms,
        help="the policies see the experts as the gateway does, from scrapes of the "
        "engines' metrics this many ms apart (default: exactly); results of their own",
    )
    add_predictor_option(qi)
    qi.add_argument(
        "--settings",
        type=lambda text: text.split(","),
        metavar="LABEL,...",
        help="the sweep points measured, as bench qos labels them (default, N=12, "
        "lambda=8, L=40ms, ...); default: the six-expert ones, the default and the "
        "sweeps of lambda and L; results of their own",
    )
    qi.set_defaults(func=lambda a: _qos_impact(a))
    qs = command(
        "qos-shares", help="where each policy sends requests on the engines, and what it earns"
    )
    engine_episode_options(qs, QUALITIES[0])
    qs.add_argument("--n", type=positive_int, default=6, help="engines (the profiles cycled)")
    qs.add_argument("--rate", type=positive_rate, default=5.0, help="requests per second")
    qs.add_argument(
        "--latency-ms", type=positive_ms, default=30.0, help="the latency target L per token"
    )
    qs.add_argument(
        "--trace",
        type=Path,
        help="arrivals from this trace, Azure CSV or Mooncake JSONL (its token counts, its instants "
        "rescaled to --rate), seed k reading its k-th window; default: Poisson",
    )
    add_predictor_option(qs)
    qs.set_defaults(func=lambda a: _qos_shares(a))
    qr = command(
        "qos-rollout",
        help="an agent against itself improved by one rollout step on the simulator (a "
        "reference: what better decisions are worth at a setting)",
    )
    engine_episode_options(qr, "routerdc", model_required=True)
    qr.add_argument(
        "--rates", type=positive_rates, default=[5.0], metavar="R1,R2", help="lambdas, per second"
    )
    look = Lookahead()
    qr.add_argument(
        "--horizon",
        type=positive_int,
        default=look.horizon,
        help="decisions each copy of the episode runs",
    )
    qr.add_argument(
        "--futures", type=positive_int, default=look.futures, help="copies per engine tried"
    )
    qr.add_argument(
        "--truth",
        action="store_true",
        help="the copies know the requests' real lengths and scores (a bound), not their "
        "predicted ones",
    )
    qr.add_argument(
        "--own",
        action="store_true",
        help="score a copy by the tried request's QoS alone, not every request it routes",
    )
    qr.set_defaults(func=lambda a: _qos_rollout(a))
    qp = command("qos-pool", help="live QoS runs of one setting pooled over all their seeds")
    qp.add_argument(
        "runs", nargs="+", type=Path, metavar="RESULTS.json", help="`bench qos --live` results"
    )
    qp.add_argument("--json", help="also write the results as JSON here")
    qp.set_defaults(func=lambda a: _qos_pool(a))
    qj = command(
        "qos-join",
        help="two simulated QoS runs of one world on the same seeds, as one run of all "
        "their agents",
    )
    qj.add_argument("first", type=Path, metavar="FIRST.json", help="`bench qos` results")
    qj.add_argument(
        "second", type=Path, metavar="SECOND.json", help="`bench qos` results of other agents"
    )
    qj.add_argument("--json", help="also write the results as JSON here")
    qj.set_defaults(func=lambda a: _qos_join(a))
    rp = command(
        "qos-replay", help="a live QoS run's own request streams replayed in the simulator"
    )
    rp.add_argument("run", type=Path, metavar="RESULTS.json", help="`bench qos --live` results")
    add_physics_options(rp)
    add_lateness_options(rp)
    rp.add_argument("--json", help="also write the results as JSON here")
    rp.set_defaults(func=lambda a: _qos_replay(a))
    pd = command("qos-paired", help="paired differences between policies of one QoS run")
    pd.add_argument("run", type=Path, metavar="RESULTS.json", help="`bench qos` results")
    pd.add_argument(
        "--pair",
        action="append",
        default=[],
        type=policy_pair,
        metavar="A,B",
        help="A minus B seed by seed, repeatable; default: the first agent minus each other",
    )
    pd.add_argument(
        "--runs",
        action="store_true",
        help="count the agents' training runs as well as the seeds (a simulated run's "
        "per-run figures): would training both again keep the difference?",
    )
    pd.add_argument("--json", help="also write the table as JSON here")
    pd.set_defaults(func=lambda a: _qos_paired(a))
    qb = command("qos-bar", help="issue 17's bar read from one QoS run, over seeds and over runs")
    qb.add_argument("run", type=Path, metavar="RESULTS.json", help="`bench qos` results")
    qb.add_argument("--agent", required=True, help="the agent judged, as --model named it")
    qb.add_argument(
        "--baseline",
        action="append",
        default=[],
        metavar="NAME",
        help="an agent of the run that is a baseline (dsa, Baseline RL), repeatable; the "
        "heuristics always are",
    )
    qb.add_argument(
        "--max-loop-lag-ms",
        type=float,
        metavar="MS",
        help="refuse to judge a live run whose harness's event loop lagged more than this "
        "(its p99 on any seed of the judged policies, emulated ms); by default the worst "
        "lag is only shown",
    )
    qb.add_argument("--json", help="also write the table as JSON here")
    qb.add_argument("--plot", type=Path, help="also draw the intervals, as PNG, here")
    qb.set_defaults(func=lambda a: _qos_bar(a))
    g = command("growth", help="decision time and memory against backends, in-flight and replicas")
    common(g)
    g.set_defaults(func=lambda a: _growth(a))
    ov = command("overload", help="goodput and sheds from 1/4 to 4x capacity")
    common(ov)
    ov.set_defaults(func=lambda a: _overload(a))
    so = command("soak", help="mixed streaming traffic for a long while (not in CI)")
    common(so)
    so.add_argument("--minutes", type=float, default=10.0, help="how long the traffic runs")
    so.set_defaults(func=lambda a: _soak(a))
    pe = command(
        "peers", help="beside nginx, vllm-router, sglang-router, LiteLLM (shared/bench-peers)"
    )
    common(pe)
    pe.add_argument("--harness", help="the bench-peers folder (default: ../shared/bench-peers)")
    pe.add_argument("--policies", default="least_load,cla", help="one gateway target each")
    pe.add_argument("--only", help="peers to run besides the gateway, e.g. nginx,vllm-router")
    pe.add_argument("--rounds", type=int, help="measurement rounds (default: the harness's)")
    pe.set_defaults(func=lambda a: _peers(a))
    d = command("dashboard", help="the Grafana dashboard's panels from a real run, via Prometheus")
    common(d)
    d.add_argument("--seconds", type=float, default=360.0, help="length of the traffic")
    d.add_argument(
        "--data-dir", help="data folder (default: $EDGEROUTE_DATA_DIR or ../shared/data)"
    )
    d.set_defaults(func=lambda a: _dashboard(a))
    lv = command("live", "routers side by side on a replayed trace, same workers, same arrivals")
    common(lv)
    lv.add_argument(
        "--trace",
        help="Mooncake JSONL, Azure CSV or RouterBench prompt-set file (default: the data "
        "folder's Mooncake trace; experts pool: RouterBench's MBPP test prompts; MoE pool: "
        "the Azure conversation trace)",
    )
    lv.add_argument(
        "--pool",
        default="mixed",
        choices=["mixed", "experts", "moe", "pd", "pd-net"],
        help="the workers: mixed engines, quality experts, MoE workers, or prefill/decode "
        "(pd-net: on a network of its own, congestion from the operator's telemetry)",
    )
    lv.add_argument(
        "--data-dir", help="data folder (default: $EDGEROUTE_DATA_DIR or ../shared/data)"
    )
    lv.add_argument(
        "--routers", help="comma-separated router names (default: all the pool's; --quick: a few)"
    )
    lv.add_argument("--loads", default="0.5,1.0,1.5", help="fractions of the measured capacity")
    lv.add_argument("--seeds", type=int, default=5, help="seeds per point (--quick: 1)")
    lv.add_argument(
        "--seconds", type=float, default=90.0, help="emulated seconds of arrivals per run"
    )
    lv.add_argument("--speedup", type=float, default=4.0, help="emulated time per wall second")
    lv.add_argument("--ttft-slo", type=float, default=10.0, help="TTFT SLO, emulated seconds")
    lv.add_argument(
        "--tpot-slo", type=float, default=0.1, help="mean inter-token latency SLO, seconds"
    )
    lv.add_argument(
        "--capacity",
        type=float,
        help="completions per second to call 100%% load (default: measure it)",
    )
    lv.add_argument("--name", default="live", help="the results files' name")
    lv.set_defaults(func=lambda a: _live(a))
    w = command(
        "worker-capacity", help="concurrent streams one worker sustains within 5%% timing error"
    )
    common(w)
    w.set_defaults(func=lambda a: _capacity(a))


def _live(a: argparse.Namespace) -> None:
    from edgeroute.bench.live import ROUTERS, Settings, main
    from workers.quality import default_data_dir

    data = Path(a.data_dir) if a.data_dir else default_data_dir()
    default_trace = {
        "experts": data / "router_quality" / "routerbench_0shot_mbpp_test.csv.gz",
        "moe": data / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv.gz",
    }.get(a.pool, data / "mooncake" / "conversation_trace.jsonl.gz")
    trace = Path(a.trace) if a.trace else default_trace
    mine = [n for n, r in ROUTERS.items() if a.pool in r.pools]
    quick_routers = [
        n for n in ("round_robin", "least_load", "composed", "vllm-router cache_aware") if n in mine
    ] + [n for n in mine if ROUTERS[n].pools == {a.pool}][:2]
    if a.routers:
        routers = tuple(r.strip() for r in a.routers.split(","))
    else:
        routers = tuple(quick_routers if a.quick else mine)
    settings = Settings(
        trace=trace,
        routers=routers,
        loads=(1.0,) if a.quick else tuple(float(x) for x in a.loads.split(",")),
        seeds=tuple(range(a.seed, a.seed + (1 if a.quick else a.seeds))),
        seconds=30.0 if a.quick else a.seconds,
        speedup=a.speedup,
        ttft_slo=a.ttft_slo,
        tpot_slo=a.tpot_slo,
        pool=a.pool,
        capacity=a.capacity,
        data_dir=data,
    )
    main(settings, a.json, a.quick, a.name)


def _policies(a: argparse.Namespace) -> None:
    from edgeroute.bench.policies import main

    main(a.quick, a.seed, a.json)


def _idle(a: argparse.Namespace) -> None:
    from edgeroute.bench.idle import main

    main(a.quick, a.seed, a.json)


def _overhead(a: argparse.Namespace) -> None:
    from edgeroute.bench.overhead import main

    main(a.quick, a.seed, a.json, a.policies.split(","))


def _reload(a: argparse.Namespace) -> None:
    from edgeroute.bench.reload import main

    main(a.quick, a.seed, a.json)


def _overhead_ab(a: argparse.Namespace) -> None:
    from edgeroute.bench.overhead_ab import main

    main(a.before.resolve(), a.after.resolve(), a.pairs, a.seconds, a.json, a.name, a.phase)


def _capacity(a: argparse.Namespace) -> None:
    from edgeroute.bench.worker_capacity import main

    main(a.quick, a.seed, a.json)


def _netkv(a: argparse.Namespace) -> None:
    if a.live:
        from edgeroute.bench import live
        from edgeroute.sim.workload import PROFILES
        from workers.quality import default_data_dir

        trace = a.trace or default_data_dir() / "mooncake" / "conversation_trace.jsonl.gz"
        settings = live.Settings(
            trace=Path(trace),
            routers=("netkv_full", "decode_rr", "decode_la", "decode_cla"),
            loads=(1.0,) if a.quick else (1.25,),
            seeds=tuple(range(a.seed, a.seed + (1 if a.quick else a.seeds))),
            seconds=30.0 if a.quick else 60.0,
            speedup=8.0,
            ttft_slo=PROFILES[a.profile].slo_s,
            tpot_slo=0.1,
            pool="pd-net",
        )
        live.main(settings, a.json, a.quick, "netkv_live")
        return
    from edgeroute.bench.netkv import main

    main(a.quick, a.seed, a.json, a.trace, a.profile, a.seeds)


def _serving(a: argparse.Namespace) -> dict[str, dict[str, bool]]:
    """The agents' serving parameters from `--no-shed`, `--sample` and `--speed-prior`."""
    from edgeroute.bench.qos import SERVING_FLAGS, serving_from

    return serving_from(
        {p: getattr(a, flag[2:].replace("-", "_")) for p, (flag, _) in SERVING_FLAGS.items()}
    )


def _qos(a: argparse.Namespace) -> None:
    from edgeroute.bench.qos import main

    runs = model_runs(a.model)
    ignored = _ignored_by_mode(a)
    if ignored:
        raise SystemExit(f"edgeroute bench qos: {ignored}")
    if a.live:
        from edgeroute.bench.qos_live import SPEEDUP, plan
        from edgeroute.bench.qos_live import main as live

        run = plan(
            a.quick,
            a.seed,
            runs,
            a.requests,
            rate=DEFAULT_RATE if a.rate is None else a.rate,
            latency_ms=DEFAULT_LATENCY_MS if a.latency_ms is None else a.latency_ms,
            n_seeds=3 if a.seeds is None else a.seeds,
            quality=a.quality,
            scrape_ms=a.scrape_ms,
            max_batch=a.max_batch,
            serving=_serving(a),
            engines=a.engines,
            speedup=SPEEDUP if a.speedup is None else a.speedup,
            predictor=a.predictor,
        )
        if a.predict:
            from edgeroute.bench.qos_replay import predict

            predict(run, physics_from(a), a.json, lateness_from(a))
        else:
            live(run, a.json)
        return
    main(
        a.quick,
        a.seed,
        a.json,
        runs,
        a.trace,
        a.quality,
        a.scrape_ms,
        fleet_from(a),
        _serving(a),
        hardware_from(a),
        n_seeds=a.seeds,
        physics=physics_from(a),
        predictor=a.predictor,
    )


def add_physics_options(p: argparse.ArgumentParser) -> None:
    """How the simulated engines differ from their profiles, for `bench qos` and `bench
    qos-replay` (`edgeroute.bench.qos.Physics`; read back by `physics_from`)."""
    p.add_argument(
        "--time-scale",
        type=positive_factor,
        default=1.0,
        metavar="X",
        help="simulation: every expert's time constants multiplied by X (1.02: engines 2%% "
        "slower than profiled, as the live run's are); results of their own",
    )
    p.add_argument(
        "--prefix-cache",
        action="store_true",
        help="simulation: every expert keeps the emulated engine's prefix cache, as the "
        "live run's do (a prompt it has seen skips its cached blocks' prefill); results of "
        "their own",
    )


def add_lateness_options(p: argparse.ArgumentParser) -> None:
    """How late the live client's sends come, for `bench qos-replay` and `bench qos --live
    --predict` (`edgeroute.bench.qos_replay.Lateness`; read back by `lateness_from`)."""
    p.add_argument(
        "--send-late-ms",
        type=float,
        default=0.0,
        metavar="M",
        help="replayed: each request sent late by an exponential draw of mean M emulated "
        "ms, as the live client's loop lags (0: on time); results of their own",
    )
    p.add_argument(
        "--draws",
        type=positive_int,
        default=1,
        help="with --send-late-ms: draws of lateness per seed, the seed's QoS their mean",
    )


def lateness_from(a: argparse.Namespace) -> Lateness:
    from edgeroute.bench.qos_replay import Lateness

    try:
        return Lateness(a.send_late_ms, a.draws)
    except ValueError as exc:
        raise SystemExit(f"edgeroute bench {a.benchmark}: {exc}") from None


def physics_from(a: argparse.Namespace) -> Physics:
    from edgeroute.bench.qos import Physics

    return Physics(a.time_scale, a.prefix_cache)


def _qos_replay(a: argparse.Namespace) -> None:
    from edgeroute.bench.qos_replay import main

    main(a.run, physics_from(a), a.json, lateness_from(a))


def add_hardware_options(p: argparse.ArgumentParser) -> None:
    """Where a simulated run's experts are, for `bench qos` and `bench qos-impact`
    (`edgeroute.bench.qos.Hardware`; read back by `hardware_from`)."""
    p.add_argument(
        "--held-out-hardware",
        action="store_true",
        help="simulation: every point on held-out hardware (environment seed k on the k-th "
        "held-out draw) rather than all on hardware seed 0; results of their own",
    )
    p.add_argument(
        "--engine-hardware",
        action="store_true",
        help="simulation: every point on the live run's engine profiles (N of them cycled, "
        "as --live --engines has them) rather than on hardware seed 0; results of their own",
    )


def hardware_from(a: argparse.Namespace) -> Hardware:
    return "held-out" if a.held_out_hardware else "engines" if a.engine_hardware else "seed-0"


def _fleet_changed(a: argparse.Namespace) -> list[str]:
    """The fleet's settings given other values than the paper's, by field name."""
    given, default = fleet_from(a), Fleet()
    return [f.name for f in fields(Fleet) if getattr(given, f.name) != getattr(default, f.name)]


def _hardware_refused(a: argparse.Namespace) -> str | None:
    """Why the hardware options given contradict each other or the fleet's, or None."""
    changed = _fleet_changed(a)
    if a.engine_hardware and a.held_out_hardware:
        return "--engine-hardware and --held-out-hardware: each puts every point elsewhere"
    if a.engine_hardware and changed:
        flag = "--" + changed[0].replace("_", "-")
        return f"{flag} does nothing with --engine-hardware (the engines' profiles are fixed)"
    return None


def _ignored_by_mode(a: argparse.Namespace) -> str | None:
    """Why an option given to `bench qos` would do nothing in the run asked for (live or
    simulated), or None: an ignored option would let a results file claim a setting
    its run did not have."""
    changed = _fleet_changed(a)
    if not a.predict and (a.send_late_ms or a.draws != 1):
        return (
            "--send-late-ms and --draws are for --live --predict: a live run's sends are "
            "as late as they come (it records how late), and a simulated sweep sends none"
        )
    if not a.live:
        if a.predict:
            return "--predict is for --live runs (it predicts one in the simulator)"
        live_only = (
            ("--rate", a.rate, "the simulation sweeps it"),
            ("--latency-ms", a.latency_ms, "the simulation sweeps it"),
            ("--max-batch", a.max_batch, "simulated experts take --running-cap"),
            ("--engines", a.engines, "the simulation sweeps N"),
            ("--speedup", a.speedup, "the simulation has no wall clock"),
        )
        for flag, value, why in live_only:
            if value is not None:
                return f"{flag} is for --live runs ({why})"
        return _hardware_refused(a)
    physics = ["time_scale"] * (a.time_scale != 1.0) + ["prefix_cache"] * a.prefix_cache
    simulated_only = (
        (["trace"] if a.trace is not None else [])
        + ([] if a.predict else physics)  # a prediction runs in a simulated world
        + (["held_out_hardware"] if a.held_out_hardware else [])
        + (["engine_hardware"] if a.engine_hardware else [])
        + changed
    )
    if simulated_only:
        flag = "--" + simulated_only[0].replace("_", "-")
        return (
            f"{flag} is for simulated runs (a --live run serves its emulated engines; "
            "--engines sets how many, --max-batch caps their batch)"
        )
    return None


def _qos_impact(a: argparse.Namespace) -> None:
    from edgeroute.bench.qos_impact import main

    models = dict(m.split("=", 1) for m in a.model)
    agents = {k: [Path(v)] for k, v in models.items()}
    refused = _hardware_refused(a)
    if refused:
        raise SystemExit(f"edgeroute bench qos-impact: {refused}")
    main(
        a.quick,
        a.seed,
        a.json,
        agents,
        a.quality,
        fleet_from(a),
        hardware_from(a),
        a.scrape_ms,
        a.predictor,
        a.settings,
    )


def model_runs(given: list[str]) -> dict[str, list[Path]]:
    """`--model NAME=DIR[,DIR...]` options as each agent's training runs."""
    models = dict(m.split("=", 1) for m in given)
    return {k: [Path(d) for d in v.split(",")] for k, v in models.items()}


def _qos_shares(a: argparse.Namespace) -> None:
    from edgeroute.bench.qos_shares import main

    runs = model_runs(a.model)
    main(
        a.quick,
        a.seed,
        a.seeds,
        a.json,
        runs,
        a.quality,
        a.scrape_ms,
        a.n,
        a.rate,
        a.latency_ms,
        a.trace,
        a.predictor,
    )


def _qos_rollout(a: argparse.Namespace) -> None:
    from edgeroute.bench.qos_rollout import main

    lookahead = Lookahead(a.horizon, a.futures, believed=not a.truth, own=a.own)
    main(
        a.quick,
        a.seed,
        a.seeds,
        a.json,
        model_runs(a.model),
        a.rates,
        lookahead,
        a.quality,
        a.scrape_ms,
    )


def _qos_pool(a: argparse.Namespace) -> None:
    from edgeroute.bench.qos_pool import NotPoolable, main

    try:
        main(a.runs, a.json)
    except NotPoolable as exc:
        raise SystemExit(f"edgeroute bench qos-pool: {exc}") from None


def _qos_join(a: argparse.Namespace) -> None:
    from edgeroute.bench.qos_join import NotJoinable, main

    try:
        main(a.first, a.second, a.json)
    except NotJoinable as exc:
        raise SystemExit(f"edgeroute bench qos-join: {exc}") from None


def policy_pair(text: str) -> tuple[str, str]:
    """`A,B`: two policies' names."""
    a, comma, b = text.partition(",")
    if not comma or not a or not b or "," in b:
        raise argparse.ArgumentTypeError(f"a pair is two names, A,B, not {text!r}")
    return a, b


def _qos_paired(a: argparse.Namespace) -> None:
    from edgeroute.bench.qos_paired import NotPaired, main

    try:
        main(a.run, a.pair, a.json, a.runs)
    except NotPaired as exc:
        raise SystemExit(f"edgeroute bench qos-paired: {exc}") from None


def _qos_bar(a: argparse.Namespace) -> None:
    from edgeroute.bench.qos_bar import NotJudged, main

    try:
        main(a.run, a.agent, a.baseline, a.json, a.plot, a.max_loop_lag_ms)
    except NotJudged as exc:
        raise SystemExit(f"edgeroute bench qos-bar: {exc}") from None


def _growth(a: argparse.Namespace) -> None:
    from edgeroute.bench.growth import main

    main(a.quick, a.json)


def _overload(a: argparse.Namespace) -> None:
    from edgeroute.bench.overload import main

    main(a.quick, a.json)


def _soak(a: argparse.Namespace) -> None:
    from edgeroute.bench.soak import main

    main(a.quick, a.minutes, a.json)


def _peers(a: argparse.Namespace) -> None:
    from pathlib import Path

    from edgeroute.bench.peers import main

    harness = Path(a.harness) if a.harness else None
    main(a.quick, harness, a.policies.split(","), a.only, a.rounds)


def _dashboard(a: argparse.Namespace) -> None:
    from pathlib import Path

    from edgeroute.bench.dashboard import main

    main(a.quick, a.seconds, a.json, Path(a.data_dir) if a.data_dir else None)


def _prism(a: argparse.Namespace) -> None:
    if a.live:
        from edgeroute.bench.prism_live import LiveSettings
        from edgeroute.bench.prism_live import main as live

        count = 1 if a.quick else (a.seeds or 10)
        seconds = 160.0 if a.quick else 320.0
        live(
            LiveSettings(seeds=tuple(a.seed + i for i in range(count)), seconds=seconds),
            a.json,
            a.quick,
        )
        return
    from edgeroute.bench.prism import MIXES, main

    mixes = MIXES if a.mix == "all" else (a.mix,)
    main(a.quick, a.seed, a.json, mixes, a.seeds or 5, tuple(a.arrival))


def _odmoe(a: argparse.Namespace) -> None:
    from edgeroute.bench.odmoe import main

    main(a.quick, a.seed, a.json)
