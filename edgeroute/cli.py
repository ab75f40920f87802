"""`edgeroute`: one program, with a subcommand per job."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import secrets
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from edgeroute.bench.cli import (
    DefaultsHelp,
    add_fleet_options,
    experts_range,
    fleet_from,
    positive_ms,
    positive_range,
)
from edgeroute.bench.cli import add_parser as add_bench
from gateway.logs import configure
from gateway.serving import (
    Listener,
    check_ports,
    gateway_listener,
    run,
    serve_apps,
    serve_processes,
)
from gateway.settings import BackendConfig, load_settings
from workers.quality import default_data_dir

if TYPE_CHECKING:
    from edgeroute.qos.config import TrainConfig
    from workers.server import WorkerConfig

DEMO_ALIAS = "edge-llm"


def _overrides(pairs: list[str], flag: str = "--set") -> dict[str, float | int]:
    out: dict[str, float | int] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        if not key or not value:
            raise SystemExit(f"{flag} takes key=value, not {pair!r}")
        out[key] = int(value) if value.isdigit() else float(value)
    return out


def _worker_configs(args: argparse.Namespace) -> list[WorkerConfig]:
    from oracle.topology import Topology
    from workers.server import WorkerConfig

    profiles = args.profile.split(",")
    topology = None
    if args.topology:
        import yaml

        topology = Topology.from_mapping(yaml.safe_load(Path(args.topology).read_text()))
    data_dir = Path(args.data_dir) if args.data_dir else default_data_dir()
    moe = None
    if args.moe:
        import yaml

        from workers.moe_host import MoEConfig

        moe = MoEConfig.model_validate(yaml.safe_load(Path(args.moe).read_text()))
    out = []
    for i in range(args.count):
        profile = profiles[i % len(profiles)]
        out.append(
            WorkerConfig(
                profile=profile,
                served_model_names=args.served_model_name or [],
                host=args.host,
                port=args.port + i,
                speedup=args.speedup,
                role=args.role,
                instance_id=(
                    f"{args.instance_id}-{i}"
                    if args.instance_id and args.count > 1
                    else args.instance_id
                ),
                topology=topology,
                data_dir=data_dir,
                enable_faults=args.enable_faults,
                overrides=_overrides(args.set or []),
                redis_url=args.redis_url,
                admin_token=args.admin_token,
                moe=moe,
                background={
                    k: float(v)
                    for k, v in _overrides(args.background or [], "--background").items()
                },
                background_volatility=args.background_volatility,
                seed=args.seed + i,
            )
        )
    return out


def cmd_worker(args: argparse.Namespace) -> None:
    from workers.server import Worker

    configure(args.log_level, json=not args.plain_logs)
    configs = _worker_configs(args)
    check_ports(args.host, [c.port for c in configs])
    listeners = [Listener(Worker(c).app, c.host, c.port) for c in configs]
    for c in configs:
        print(f"worker {c.profile} ({c.role}) on http://{c.host}:{c.port}", flush=True)
    run(serve_apps(listeners))


def cmd_serve(args: argparse.Namespace) -> None:
    from gateway.app import create_app

    overrides: dict[str, Any] = {}
    if args.host:
        overrides["host"] = args.host
    if args.port:
        overrides["port"] = args.port
    if args.backend:
        overrides["backends"] = [BackendConfig(url=u) for u in args.backend]
    settings = load_settings(args.config, **overrides)
    configure(settings.log_level, settings.json_logs)
    check_ports(settings.host, [settings.port])
    n = len(settings.backends)
    print(
        f"edgeroute gateway on http://{settings.host}:{settings.port} "
        f"({n} backend{'s' if n != 1 else ''}, {settings.processes} process"
        f"{'es' if settings.processes != 1 else ''})",
        flush=True,
    )
    if n == 0:
        print(
            "warning: no backends: every request will get 503 until some are added "
            "(--backend URL, `backends:` in the config, or POST /admin/backends)",
            file=sys.stderr,
            flush=True,
        )
    if settings.processes > 1:
        serve_processes(create_app, settings, settings.processes)
        return
    app = create_app(settings)
    run(
        serve_apps([gateway_listener(app, settings)]),
        settings.event_loop,
    )


def cmd_demo(args: argparse.Namespace) -> None:
    from gateway.app import create_app
    from workers.profiles import EXPERTS
    from workers.server import Worker, WorkerConfig

    configure(args.log_level, json=not args.plain_logs)
    token = os.environ.get("EDGEROUTE_ADMIN_TOKEN") or secrets.token_urlsafe(16)
    data_dir = default_data_dir()
    check_ports("127.0.0.1", [args.port, *range(args.worker_port, args.worker_port + args.workers)])
    workers = []
    for i in range(args.workers):
        profile = EXPERTS[i % len(EXPERTS)]
        workers.append(
            Worker(
                WorkerConfig(
                    profile=profile,
                    served_model_names=[profile, DEMO_ALIAS],
                    port=args.worker_port + i,
                    speedup=args.speedup,
                    data_dir=data_dir if data_dir.exists() else None,
                )
            )
        )
    settings = load_settings(
        args.config,
        host="127.0.0.1",
        port=args.port,
        admin_token=token,
        backends=[
            BackendConfig(url=f"http://127.0.0.1:{w.config.port}", id=f"worker-{i}")
            for i, w in enumerate(workers)
        ],
        routing={"default": {"policy": args.policy}},
    )
    app = create_app(settings)
    base = f"http://127.0.0.1:{args.port}"
    print(
        f"""
edgeroute demo: gateway {base} -> {args.workers} emulated workers (speedup {args.speedup:g})
"""
        + "\n".join(
            f"  worker-{i}: {w.config.profile:<24} http://127.0.0.1:{w.config.port}"
            for i, w in enumerate(workers)
        )
        + f"""

  OpenAI API   {base}/v1   (model "{DEMO_ALIAS}" on every worker, or a worker's own model name)
  metrics      {base}/metrics
  admin API    {base}/admin/backends   (admin token: {token})

Try:
  curl -s {base}/v1/chat/completions -H 'content-type: application/json' \\
    -d '{{"model": "{DEMO_ALIAS}", "messages": [{{"role": "user", "content": "Hello!"}}], "max_tokens": 32}}'

Ctrl-C stops everything.
""",
        flush=True,
    )
    listeners = [Listener(w.app, w.config.host, w.config.port) for w in workers]
    listeners.append(gateway_listener(app, settings))
    run(serve_apps(listeners))


def cmd_fit_profiles(args: argparse.Namespace) -> None:
    from workers.quality import PROFILES_FILE, fit_distributions

    data_dir = Path(args.data_dir) if args.data_dir else default_data_dir()
    fitted = fit_distributions(data_dir)
    out = Path(args.out) if args.out else PROFILES_FILE
    out.write_text(json.dumps(fitted, indent=1) + "\n")
    print(f"wrote {out} ({len(fitted['models'])} models) from {data_dir}")  # type: ignore[arg-type]


def cmd_train_qos(args: argparse.Namespace) -> None:
    from edgeroute.qos.train import train

    try:
        cfg = train_config(args)
    except ValueError as e:
        raise SystemExit(f"edgeroute train qos: {e}") from None
    data_dir = Path(args.data_dir) if args.data_dir else default_data_dir()
    train(cfg, data_dir, Path(args.out), resume=not args.restart)


def train_config(args: argparse.Namespace) -> TrainConfig:
    from edgeroute.qos.config import TrainConfig

    return TrainConfig(
        variant=args.variant,
        quality=args.quality,
        experts=args.experts,
        experts_range=args.experts_range,
        rate=args.rate,
        latency_ms=args.latency_ms,
        randomise=args.randomise,
        rates=args.rates,
        latencies_ms=args.latencies,
        latency_over_fastest=args.latency_over_fastest,
        fleet=fleet_from(args),
        scrape_ms=args.scrape_ms,
        drop=not args.no_drop,
        speed_prior=args.speed_prior,
        arrival_rate=args.arrival_rate,
        critic_arrival_rate=args.critic_arrival_rate,
        herded_starts=args.herded_starts,
        trace=args.trace,
        trace_share=args.trace_share,
        credit=args.credit,
        impact=args.impact,
        impact_scale=args.impact_scale,
        impact_scale_by_rate=args.impact_scale_by_rate,
        steps=args.steps,
        episode_len=args.episode_len,
        warmup=min(args.warmup, args.steps),
        envs=args.envs,
        update_every=args.update_every,
        batch=args.batch,
        buffer=args.buffer,
        eval_every=args.eval_every,
        eval_episodes=args.eval_episodes,
        select_on=args.select_on,
        keep=args.keep,
        seed=args.seed,
        zero_predictions=args.zero_predictions,
        predictor=args.predictor or "",
        lr=args.lr,
        gamma=args.gamma,
        target_entropy_ratio=args.target_entropy,
        init_alpha=args.init_alpha,
        hidden=args.hidden,
        heads=args.heads,
        layers=args.layers,
    )


def cmd_qos_card(args: argparse.Namespace) -> None:
    from edgeroute.qos.card import write_card

    write_card(
        Path(args.model_dir),
        Path(args.data_dir) if args.data_dir else default_data_dir(),
        [Path(p) for p in args.sim],
        [Path(p) for p in args.live],
    )


def cmd_qos_curves(args: argparse.Namespace) -> None:
    from edgeroute.qos.card import write_curves
    from edgeroute.results_io import RESULTS

    runs = [Path(p) for p in args.runs]
    if len(runs) > 1 and not args.name:
        raise SystemExit("edgeroute train qos-curves: several runs need --name for their plot")
    write_curves(runs, RESULTS / f"qos_training_{args.name or runs[0].name}.png")


def cmd_qos_last(args: argparse.Namespace) -> None:
    from edgeroute.qos.train import export_last

    try:
        record = export_last(Path(args.run), Path(args.out))
    except ValueError as exc:
        raise SystemExit(f"edgeroute train qos-last: {exc}") from None
    print(
        f"{args.out}/actor.onnx: the actor at step {record['kept_step']} (evaluated "
        f"{record['kept_eval_qos']:.3f}; the run's best {record['best_eval_qos']:.3f}); "
        f"ONNX parity max |diff| {record['onnx_parity_max_abs']:.2e}"
    )


def cmd_qos_ensemble(args: argparse.Namespace) -> None:
    from edgeroute.qos.ensemble import write_ensemble
    from edgeroute.qos.train import source_commit

    runs = [Path(p) for p in args.runs]
    try:
        record = write_ensemble(runs, Path(args.out), source_commit())
    except ValueError as exc:
        raise SystemExit(f"edgeroute train qos-ensemble: {exc}") from None
    seeds = ", ".join(str(s) for s in record["ensemble"]["seeds"])
    print(f"{args.out}/actor.onnx: {len(runs)} runs served as one (seeds {seeds})")


def cmd_qos_distill(args: argparse.Namespace) -> None:
    from edgeroute.qos.config import DistillConfig
    from edgeroute.qos.distill import distill

    dc = DistillConfig(states=args.states, epochs=args.epochs, seed=args.seed, rounds=args.rounds)
    data = Path(args.data_dir) if args.data_dir else default_data_dir()
    record = distill(Path(args.teacher), data, Path(args.out), dc)
    d = record["distilled"]
    print(
        f"{args.out}/actor.onnx: held-out KL {d['kl']:.4f}, argmax agreement "
        f"{d['argmax_agreement']:.1%}"
    )


def cmd_qos_select(args: argparse.Namespace) -> None:
    from edgeroute.qos.config import SelectConfig
    from edgeroute.qos.select import select

    try:
        sc = SelectConfig(
            episodes=args.episodes,
            keep=args.keep,
            first_hardware=args.first_hardware,
            seed=args.seed,
        )
        data = Path(args.data_dir) if args.data_dir else default_data_dir()
        record = select([Path(p) for p in args.candidates], data, sc)
    except ValueError as exc:
        raise SystemExit(f"edgeroute train qos-select: {exc}") from None
    worst = record["worst_shortfall"]
    for name in sorted(worst, key=lambda n: -worst[n]):
        mark = "picked" if name in record["picked"] else ""
        print(f"  {worst[name]:+.3f}  {name}  {mark}")
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(f"{args.out}: the scores; picked {', '.join(record['picked'])}")


def cmd_qos_rebuilt(args: argparse.Namespace) -> None:
    from edgeroute.qos.rebuild import adopt, compare, run_pairs

    differ = 0
    for name, committed, rebuilt in run_pairs(Path(args.committed), Path(args.rebuilt)):
        found = (adopt if args.adopt else compare)(committed, rebuilt)
        differ += not found.same
        verdict = "the same run" if found.same else "another run"
        print(
            f"{name}: {verdict} (weights equal: {found.weights}, evaluations equal: "
            f"{found.history}, config equal: {found.config}; best evaluation "
            f"{found.best[0]:.4f} committed, {found.best[1]:.4f} rebuilt)"
            + ("; record replaced by the rebuild's" if args.adopt and found.same else "")
        )
        if not found.same and found.same_processor is not True:
            old, new = (p or "not recorded" for p in found.processors)
            print(
                f"  trained on {old}, rebuilt on {new}: weights are equal only on the same "
                "kind of processor; compare the two runs' metrics instead (bench qos)"
            )
    if differ:
        raise SystemExit(1)


def cmd_train_moe_lm(args: argparse.Namespace) -> None:
    import json

    from edgeroute.sim.moe_lm import TrainSettings, train

    data_dir = Path(args.data_dir) if args.data_dir else default_data_dir()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    settings = TrainSettings(
        steps=args.steps,
        seed=args.seed,
        eval_every=args.eval_every,
        checkpoint_every=args.checkpoint_every,
    )
    record = train(data_dir, out, settings)
    out.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out} and its training record {out.with_suffix('.json')}")


def cmd_train_predictors(args: argparse.Namespace) -> None:
    from edgeroute.qos.predictors import compare_encoders

    data_dir = Path(args.data_dir) if args.data_dir else default_data_dir()
    compare_encoders(
        data_dir, Path(args.out), args.epochs, args.seed, args.compare, args.quality, args.read
    )


def cmd_train_predictor_read(args: argparse.Namespace) -> None:
    from edgeroute.qos.predictors import reread_predictor

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    reread_predictor(Path(args.source), out, args.read)
    print(f"wrote {out / 'predictor.onnx'} ({args.read} read of {args.source}'s weights)")


def _read_option(parser: argparse.ArgumentParser) -> None:
    from edgeroute.qos.config import READS

    parser.add_argument(
        "--read",
        choices=READS,
        default=READS[0],
        help="each expert's bucket: the most likely one (the paper's) or the expected "
        "one, rounded (keeps how sure the classifier is)",
    )


def _data_dir_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir", help="the data folder (default: $EDGEROUTE_DATA_DIR or ../shared/data)"
    )


def _actor_out_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="the folder for actor.onnx and its record")


def _version() -> str:
    try:
        return importlib.metadata.version("edgeroute")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="edgeroute", description=__doc__, formatter_class=DefaultsHelp)
    p.add_argument("--version", action="version", version=f"edgeroute {_version()}")
    sub = p.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gateway", formatter_class=DefaultsHelp)
    serve.add_argument("--config", help="YAML settings file (default: $EDGEROUTE_CONFIG)")
    serve.add_argument("--host", help="address to listen on (default: the config's, 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (default: the config's, 8000)")
    serve.add_argument(
        "--backend", action="append", help="backend URL, e.g. http://127.0.0.1:8100 (repeatable)"
    )
    serve.set_defaults(func=cmd_serve)

    worker = sub.add_parser(
        "worker", help="run emulated vLLM workers", formatter_class=DefaultsHelp
    )
    worker.add_argument(
        "--profile",
        default="mistral-7b-chat",
        help="engine profile, or a comma-separated list cycled over --count",
    )
    worker.add_argument("--count", type=int, default=1, help="workers in this process")
    worker.add_argument("--host", default="127.0.0.1", help="address to listen on")
    worker.add_argument("--port", type=int, default=8100, help="port of the first worker")
    worker.add_argument(
        "--speedup",
        type=float,
        default=1.0,
        help="run the emulated clock this many times faster than wall time",
    )
    worker.add_argument(
        "--role",
        choices=["both", "prefill", "decode"],
        default="both",
        help="whole requests, or one side of prefill/decode disaggregation",
    )
    worker.add_argument(
        "--served-model-name",
        action="append",
        help="model name to serve (repeatable; default: the profile name)",
    )
    worker.add_argument("--instance-id", help="this instance's name in the topology")
    worker.add_argument("--topology", help="YAML topology for emulated KV transfers")
    worker.add_argument(
        "--moe", help="YAML MoE mode settings (the experts hosted, link, costs): an MoE worker"
    )
    worker.add_argument(
        "--background",
        action="append",
        metavar="TIER=MEAN",
        help="this instance's own background utilisation on a tier into it, wandering "
        "around MEAN (repeatable; needs --topology)",
    )
    worker.add_argument(
        "--background-volatility",
        type=float,
        default=0.5,
        help="how far the background wanders, relative to its mean, per sqrt(second)",
    )
    worker.add_argument("--seed", type=int, default=0, help="the emulated world's seed")
    worker.add_argument(
        "--redis-url",
        default=os.environ.get("EDGEROUTE_REDIS_URL"),
        help="follow the NetKV oracle's topology in this shared store",
    )
    worker.add_argument(
        "--data-dir", help="quality data folder (default: $EDGEROUTE_DATA_DIR or ../shared/data)"
    )
    worker.add_argument(
        "--admin-token",
        default=os.environ.get("EDGEROUTE_WORKER_ADMIN_TOKEN"),
        help="bearer token for the worker's /admin/* (default: "
        "$EDGEROUTE_WORKER_ADMIN_TOKEN; without one the admin API is closed)",
    )
    worker.add_argument(
        "--enable-faults",
        action="store_true",
        help="accept POST /admin/fault to inject failures (tests only)",
    )
    worker.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a profile constant, e.g. --set kv_blocks=512",
    )
    worker.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    worker.add_argument("--plain-logs", action="store_true", help="text logs instead of JSON")
    worker.set_defaults(func=cmd_worker)

    demo = sub.add_parser(
        "demo", help="gateway + N emulated workers + embedded store", formatter_class=DefaultsHelp
    )
    demo.add_argument("--port", type=int, default=8000, help="the gateway's port")
    demo.add_argument("--workers", type=int, default=4, help="emulated workers to start")
    demo.add_argument(
        "--worker-port", type=int, default=8101, help="port of the first worker (then +1 each)"
    )
    demo.add_argument(
        "--speedup", type=float, default=1.0, help="run the workers' clock this much faster"
    )
    demo.add_argument("--policy", default="least_load", help="the routing policy (see README)")
    demo.add_argument("--config", help="YAML settings file for the gateway")
    demo.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING or ERROR")
    demo.add_argument("--plain-logs", action="store_true", help="text logs instead of JSON")
    demo.set_defaults(func=cmd_demo)

    fit = sub.add_parser(
        "fit-profiles",
        help="refit the workers' per-task distributions from the quality data",
        formatter_class=DefaultsHelp,
    )
    _data_dir_option(fit)
    fit.add_argument("--out", help="where to write (default: the workers' packaged profiles)")
    fit.set_defaults(func=cmd_fit_profiles)

    tr = sub.add_parser("train", help="train a learned policy", formatter_class=DefaultsHelp)
    which = tr.add_subparsers(dest="what", required=True)
    q = which.add_parser(
        "qos",
        help="the QoS-aware deep-RL router, on the edge simulator",
        formatter_class=DefaultsHelp,
    )
    q.add_argument(
        "--variant",
        choices=["full", "dsa", "baseline"],
        default="full",
        help="the paper's agent, its DSA ablation, or the baseline RL",
    )
    from edgeroute.qos.config import KEEP, QUALITIES, DistillConfig, SelectConfig, TrainConfig

    t = TrainConfig()
    q.add_argument(
        "--quality",
        choices=QUALITIES,
        default=t.quality,
        help="the quality data: RouterBench's MBPP (0/1) or RouterDC's graded tasks; "
        "the predictor is the one in that world's folder (models/qos, models/qos/routerdc)",
    )
    q.add_argument("--steps", type=int, default=t.steps, help="environment steps")
    q.add_argument(
        "--episode-len",
        type=int,
        default=t.episode_len,
        help="decisions per training episode (live runs are 1,000 requests long)",
    )
    q.add_argument("--warmup", type=int, default=t.warmup, help="random steps before learning")
    q.add_argument("--eval-every", type=int, default=t.eval_every, help="steps between evaluations")
    q.add_argument(
        "--eval-episodes",
        type=int,
        default=t.eval_episodes,
        help="episodes per evaluation at the default setting (with --select-on default)",
    )
    q.add_argument(
        "--select-on",
        choices=["default", "sweep"],
        default=t.select_on,
        help="choose the checkpoint on the default setting or on every point of the "
        "paper's sweep (training hardware and prompts either way)",
    )
    q.add_argument(
        "--keep",
        choices=KEEP,
        default=t.keep,
        help="export the actor of the best evaluation, or of the last step (chosen without "
        "looking at any evaluation; `train qos-last` does it for a run already trained)",
    )
    q.add_argument("--envs", type=int, default=t.envs, help="environments stepped together")
    q.add_argument(
        "--update-every", type=int, default=t.update_every, help="env steps per SAC update"
    )
    q.add_argument("--batch", type=int, default=t.batch, help="samples per SAC update")
    q.add_argument(
        "--buffer", type=int, default=t.buffer, help="transitions the replay keeps, newest first"
    )
    q.add_argument("--experts", type=int, default=t.experts, help="N, the expert servers")
    q.add_argument(
        "--experts-range",
        type=experts_range,
        default=t.experts_range,
        metavar="LO,HI",
        help="draw each episode's N in [LO, HI] instead of --experts",
    )
    q.add_argument("--rate", type=float, default=t.rate, help="Poisson arrivals per second")
    q.add_argument("--latency-ms", type=float, default=t.latency_ms, help="L, per token")
    q.add_argument(
        "--randomise",
        action=argparse.BooleanOptionalAction,
        default=t.randomise,
        help="draw each episode's lambda in --rates and L in --latencies",
    )
    q.add_argument(
        "--rates",
        type=positive_range,
        default=t.rates,
        metavar="LO,HI",
        help="with --randomise: the range each episode's lambda (per second) is drawn from",
    )
    q.add_argument(
        "--latencies",
        type=positive_range,
        default=t.latencies_ms,
        metavar="LO,HI",
        help="with --randomise: the range each episode's L (ms) is drawn from",
    )
    q.add_argument(
        "--latency-over-fastest",
        type=positive_range,
        default=t.latency_over_fastest,
        metavar="LO,HI",
        help="with --randomise: draw each episode's L as its fastest expert's base ms per "
        "iteration times a factor in [LO, HI], instead of from --latencies",
    )
    add_fleet_options(q)
    q.add_argument(
        "--scrape-ms",
        type=positive_ms,
        default=t.scrape_ms,
        metavar="MS",
        help="the agent sees the experts as the gateway does, from scrapes of the engines' "
        "metrics every MS ms (counts, memory, estimated progress); default: their exact state",
    )
    q.add_argument(
        "--no-drop",
        action="store_true",
        help="train without the drop action, for engines that queue rather than refuse "
        "(the served actor then never sheds)",
    )
    q.add_argument(
        "--speed-prior",
        action="store_true",
        help="the agent reads an expert that has finished no request at the mean measured "
        "speed, and its actor is always served so",
    )
    q.add_argument(
        "--arrival-rate",
        action="store_true",
        help="the agent reads the load: the requests arriving per second per expert, as the "
        "gateway measures it",
    )
    q.add_argument(
        "--critic-arrival-rate",
        action="store_true",
        help="the critic reads the load; without --arrival-rate the actor's state and "
        "served graph stay as without it",
    )
    q.add_argument(
        "--herded-starts",
        type=float,
        default=t.herded_starts,
        metavar="SHARE",
        help="this share of training episodes sends its first decisions (up to 40) to one "
        "expert drawn at random, whatever the actor says",
    )
    q.add_argument(
        "--trace",
        default=t.trace,
        metavar="FILE",
        help="a trace (Mooncake JSONL or Azure CSV; a path in the data folder, or an "
        "absolute one) whose windows, with their token counts, give --trace-share of the "
        "training episodes their arrivals",
    )
    q.add_argument(
        "--trace-share",
        type=float,
        default=t.trace_share,
        metavar="SHARE",
        help="the share of training episodes that read a window of --trace",
    )
    q.add_argument(
        "--credit",
        choices=["request", "completion"],
        default=t.credit,
        help="reward each decision with its request's QoS, or completions as they happen",
    )
    q.add_argument(
        "--impact",
        choices=["reached", "pushed", "counterfactual", "hindsight", "shared"],
        default=t.impact,
        help="eq. 15 counts running requests that reach L with the new one, or only "
        "those it pushes over; counterfactual: instead of eq. 15, the QoS the expert's "
        "other requests truly lose (the simulator's future with and without the request, "
        "nothing more arriving); hindsight: the same with the requests that arrived while "
        "it ran; shared: hindsight with each request's loss shared among the requests that "
        "each caused it (both need --credit request)",
    )
    q.add_argument(
        "--impact-scale",
        type=float,
        default=t.impact_scale,
        help="the impact penalty's weight in a decision's reward (eq. 16: 1)",
    )
    q.add_argument(
        "--impact-scale-by-rate",
        type=positive_range,
        default=t.impact_scale_by_rate,
        metavar="LIGHT,HEAVY",
        help="scale the impact penalty's weight by LIGHT at the bottom of --rates and "
        "HEAVY at its top, linear in each episode's lambda between",
    )
    q.add_argument("--seed", type=int, default=t.seed, help="the training seed")
    q.add_argument(
        "--zero-predictions", action="store_true", help="train without the QoS predictions"
    )
    q.add_argument(
        "--predictor",
        help="the folder of the predictor the agent reads (default: the quality world's); "
        "--out must be under it, so that the actor is served with it",
    )
    q.add_argument("--lr", type=float, default=t.lr, help="learning rate")
    q.add_argument("--gamma", type=float, default=t.gamma, help="SAC's discount")
    q.add_argument(
        "--target-entropy",
        type=float,
        default=t.target_entropy_ratio,
        help="SAC's target entropy, as a share of log(actions)",
    )
    q.add_argument(
        "--init-alpha", type=float, default=t.init_alpha, help="SAC's starting temperature"
    )
    q.add_argument("--hidden", type=int, default=t.hidden, help="HAN width")
    q.add_argument("--heads", type=int, default=t.heads, help="attention heads")
    q.add_argument("--layers", type=int, default=t.layers, help="HAN layers")
    q.add_argument(
        "--restart", action="store_true", help="ignore a checkpoint in --out and start over"
    )
    _data_dir_option(q)
    q.add_argument("--out", default="models/qos", help="where the model and its record go")
    q.set_defaults(func=cmd_train_qos)

    qc = which.add_parser(
        "qos-card",
        help="write the QoS router's model card and learning curves from its runs",
        formatter_class=DefaultsHelp,
    )
    qc.add_argument("--model-dir", default="models/qos", help="the model and its runs/")
    qc.add_argument(
        "--sim",
        action="append",
        default=[],
        metavar="RESULTS.json",
        help="a `bench qos` results file to show (repeatable; default: the one named "
        "after the folder, results/qos<_folder>.json)",
    )
    qc.add_argument(
        "--live",
        action="append",
        default=[],
        metavar="RESULTS.json",
        help="a `bench qos --live` results file to show (repeatable; default: "
        "results/qos_live<_folder>.json)",
    )
    _data_dir_option(qc)
    qc.set_defaults(func=cmd_qos_card)

    qv = which.add_parser(
        "qos-curves",
        help="plot the learning curves of the QoS runs in a folder (argmax solid, draws dotted)",
        formatter_class=DefaultsHelp,
    )
    qv.add_argument(
        "runs", nargs="+", help="runs (folders with a training.json) or folders of runs"
    )
    qv.add_argument(
        "--name",
        help="the plot is bench/results/qos_training_NAME.png (default: the folder's; "
        "needed for several)",
    )
    qv.set_defaults(func=cmd_qos_curves)

    ql = which.add_parser(
        "qos-last",
        help="export a run's final actor (from its checkpoint) rather than its best-evaluated",
        formatter_class=DefaultsHelp,
    )
    ql.add_argument("run", help="a run's folder, with its checkpoint.pt")
    _actor_out_option(ql)
    ql.set_defaults(func=cmd_qos_last)

    qe = which.add_parser(
        "qos-ensemble",
        help="serve several training runs of one config as one actor: the mean of their "
        "action probabilities",
        formatter_class=DefaultsHelp,
    )
    qe.add_argument("runs", nargs="+", help="the runs' folders (each with actor.onnx)")
    _actor_out_option(qe)
    qe.set_defaults(func=cmd_qos_ensemble)

    qd = which.add_parser(
        "qos-distill",
        help="one actor trained to act as another (an ensemble): its probabilities on "
        "the states it visits in its training worlds",
        formatter_class=DefaultsHelp,
    )
    dd = DistillConfig()
    qd.add_argument("teacher", help="the folder of the actor to copy, with its record")
    _actor_out_option(qd)
    qd.add_argument("--states", type=int, default=dd.states, help="states visited and learnt")
    qd.add_argument("--epochs", type=int, default=dd.epochs, help="passes over them")
    qd.add_argument("--seed", type=int, default=dd.seed, help="the worlds' and the student's seed")
    qd.add_argument(
        "--rounds",
        type=int,
        default=dd.rounds,
        help="1: learn the teacher's states; more: each further round adds half as many "
        "states where the student acts, labelled by the teacher (DAgger)",
    )
    _data_dir_option(qd)
    qd.set_defaults(func=cmd_qos_distill)

    qs = which.add_parser(
        "qos-select",
        help="which of one config's actors to serve: each scored at every sweep point in "
        "its training worlds, the ones whose worst point is closest to the best kept",
        formatter_class=DefaultsHelp,
    )
    ds = SelectConfig()
    qs.add_argument("candidates", nargs="+", help="the actors' folders (each with its record)")
    qs.add_argument("--out", required=True, help="the JSON file for the scores and the picks")
    qs.add_argument("--keep", type=int, default=ds.keep, help="how many to pick")
    qs.add_argument("--episodes", type=int, default=ds.episodes, help="episodes per point")
    qs.add_argument(
        "--first-hardware",
        type=int,
        default=ds.first_hardware,
        help="the first training hardware seed scored on",
    )
    qs.add_argument("--seed", type=int, default=ds.seed, help="the episodes' arrivals and prompts")
    _data_dir_option(qs)
    qs.set_defaults(func=cmd_qos_select)

    qr = which.add_parser(
        "qos-rebuilt",
        help="whether runs trained again are the committed runs (weights, config and every "
        "argmax evaluation equal); exits 1 if any is not",
        formatter_class=DefaultsHelp,
    )
    qr.add_argument("committed", help="a committed run, or a folder of runs")
    qr.add_argument("rebuilt", help="its rebuild, or a folder of runs of the same names")
    qr.add_argument(
        "--adopt",
        action="store_true",
        help="replace each committed record by its rebuild's where the run is the same "
        "(the committed actor.onnx is kept)",
    )
    qr.set_defaults(func=cmd_qos_rebuilt)

    pr = which.add_parser(
        "predictors",
        help="the QoS router's score and length predictors",
        formatter_class=DefaultsHelp,
    )
    pr.add_argument("--epochs", type=int, default=6, help="passes over the training split")
    pr.add_argument("--seed", type=int, default=0, help="the training seed")
    pr.add_argument(
        "--compare",
        action="store_true",
        help="also train on frozen MiniLM embeddings (needs sentence-transformers)",
    )
    _data_dir_option(pr)
    pr.add_argument(
        "--quality",
        choices=QUALITIES,
        default=QUALITIES[0],
        help="the quality data: RouterBench's MBPP (0/1) or RouterDC's graded tasks",
    )
    pr.add_argument("--out", default="models/qos", help="where the predictors go")
    _read_option(pr)
    pr.set_defaults(func=cmd_train_predictors)

    rr = which.add_parser(
        "predictor-read",
        help="a trained predictor's weights exported with another read of its buckets",
        formatter_class=DefaultsHelp,
    )
    rr.add_argument("source", help="the folder of the trained predictor.onnx and .json")
    rr.add_argument("--out", required=True, help="the folder for the re-read predictor")
    _read_option(rr)
    rr.set_defaults(func=cmd_train_predictor_read)

    lm = which.add_parser(
        "moe-lm",
        help="the small MoE language model OD-MoE's shadow is measured on",
        formatter_class=DefaultsHelp,
    )
    lm.add_argument("--steps", type=int, default=3000, help="optimiser steps")
    lm.add_argument("--seed", type=int, default=0, help="the training seed")
    lm.add_argument("--eval-every", type=int, default=250, help="steps between evaluations")
    lm.add_argument(
        "--checkpoint-every", type=int, default=250, help="steps between checkpoints (resumed)"
    )
    _data_dir_option(lm)
    lm.add_argument("--out", default="models/odmoe/tiny_moe.pt", help="the checkpoint")
    lm.set_defaults(func=cmd_train_moe_lm)

    add_bench(sub)
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:
        message = _one_line(exc)
        if message is None:
            raise  # a bug: the traceback is what helps
        words = (args.command, getattr(args, "benchmark", None), getattr(args, "what", None))
        command = " ".join(w for w in words if w)
        print(f"edgeroute {command}: error: {message}", file=sys.stderr)
        sys.exit(2)


def _one_line(exc: Exception) -> str | None:
    """A user's mistake (a bad file, URL, setting or port) as one line; None for a bug."""
    from pydantic import ValidationError

    from policies import PluginError

    if isinstance(exc, ValidationError):
        wrong = []
        for e in exc.errors():
            where = ".".join(str(p) for p in e["loc"])
            msg = e["msg"].removeprefix("Value error, ")
            wrong.append(f"{where}: {msg}" if where else msg)
        return "invalid settings: " + "; ".join(wrong)
    if isinstance(exc, FileNotFoundError):
        hint = ""
        data = str(default_data_dir())
        if exc.filename is not None and str(exc.filename).startswith(data):
            hint = (
                " (this needs the shared data folder: ../shared/data beside the checkout, "
                "or set $EDGEROUTE_DATA_DIR, or --data-dir where offered; see the README's Data)"
            )
        return f"{exc.strerror}: {exc.filename}{hint}"
    if isinstance(exc, yaml.YAMLError):
        return f"the YAML does not parse: {' '.join(str(exc).split())}"
    if isinstance(exc, OSError | PluginError | ValueError):
        return str(exc)
    return None


if __name__ == "__main__":
    main()
