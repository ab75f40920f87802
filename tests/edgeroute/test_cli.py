"""The `edgeroute` command's manners: a user's mistake is one line and an exit code,
never a traceback; every option says what it does."""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import subprocess
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from edgeroute.bench.cli import fleet_from
from edgeroute.bench.qos_live import LivePlan
from edgeroute.cli import build_parser, main, train_config
from edgeroute.qos.config import RECORD, TrainConfig, read_record
from edgeroute.sim.edge import Fleet
from gateway.ports import free_ports
from policies.predictor import MODEL_ROOT


def edgeroute(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgeroute.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "EDGEROUTE_ADMIN_TOKEN": "t"},
    )


def assert_one_line_error(r: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    for text in expected:
        assert text in lines[0], lines[0]


def test_mistakes_are_one_line(tmp_path: Path) -> None:
    r = edgeroute("serve", "--backend", "not a url", "--port", str(free_ports(1)[0]))
    assert_one_line_error(r, "edgeroute serve: error: invalid settings: url: url must be an http")
    r = edgeroute("serve", "--config", str(tmp_path / "missing.yaml"))
    assert_one_line_error(r, "No such file or directory", "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("backends: [\n  - url: http://x\n retries: 2\n")
    assert_one_line_error(edgeroute("serve", "--config", str(broken)), "YAML does not parse")
    typo = tmp_path / "typo.yaml"
    typo.write_text("retires: 2\n")
    assert_one_line_error(edgeroute("serve", "--config", str(typo)), "retires")
    policy = tmp_path / "policy.yaml"
    policy.write_text("routing: {default: {policy: no_such_policy}}\n")
    assert_one_line_error(edgeroute("serve", "--config", str(policy)), "no_such_policy")


def test_a_busy_port_is_named_before_anything_starts() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = edgeroute(
            "demo", "--port", str(free_ports(1)[0]), "--worker-port", str(port), "--workers", "1"
        )
        assert_one_line_error(r, f"127.0.0.1:{port}")
        assert "edgeroute demo:" not in r.stdout  # no banner for a demo that cannot start
        r = edgeroute("serve", "--port", str(port))
        assert_one_line_error(r, f"127.0.0.1:{port}")


def test_serve_says_where_it_listens_and_warns_without_backends() -> None:
    port = free_ports(1)[0]
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgeroute.cli", "serve", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline().startswith(
            f"edgeroute gateway on http://127.0.0.1:{port} (0 backends"
        )
        assert proc.stderr.readline().startswith("warning: no backends")
    finally:
        proc.kill()
        proc.wait()


def test_version() -> None:
    r = edgeroute("--version")
    assert r.returncode == 0 and r.stdout.startswith("edgeroute ")


def _options(parser: argparse.ArgumentParser, path: str) -> list[tuple[str, argparse.Action]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _options(sub, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction | argparse._VersionAction):
            out.append((f"{path} {'/'.join(action.option_strings) or action.dest}", action))
    return out


@pytest.mark.parametrize("where", ["edgeroute"])
def test_every_option_has_help(where: str) -> None:
    missing = [name for name, action in _options(build_parser(), where) if not action.help]
    assert missing == []


def test_a_benchmark_without_its_data_says_so_in_one_line(tmp_path: Path) -> None:
    for bench in ("netkv", "qos", "prism"):
        r = subprocess.run(
            [sys.executable, "-m", "edgeroute.cli", "bench", bench, "--quick"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "EDGEROUTE_DATA_DIR": str(tmp_path / "nothing")},
        )
        assert_one_line_error(r, f"edgeroute bench {bench}: error:", "shared data folder")


def test_a_quick_run_writes_beside_the_results_never_over_them() -> None:
    from edgeroute import results_io

    tracked = {p: p.stat().st_mtime_ns for p in results_io.RESULTS.iterdir()}
    r = edgeroute("bench", "policies", "--quick", timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"quick run: its files go to {results_io.QUICK}" in r.stdout
    for name in ("policies.json", "policies.md", "policies.png"):
        assert f"wrote {results_io.QUICK / name}" in r.stdout
        assert (results_io.QUICK / name).stat().st_size > 0
    assert {p: p.stat().st_mtime_ns for p in results_io.RESULTS.iterdir()} == tracked


def test_a_fleet_size_range_is_whole_numbers_from_1_low_then_high(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The option reads two whole numbers; `TrainConfig` alone checks their order."""
    parser = build_parser()
    args = parser.parse_args(["train", "qos", "--experts-range", "3,12"])
    assert args.experts_range == (3, 12) and train_config(args).most_experts == 12
    for bad in ("3.5,12", "3", "a,b"):
        with pytest.raises(SystemExit):
            parser.parse_args(["train", "qos", "--experts-range", bad])
        assert "--experts-range: expected whole numbers" in capsys.readouterr().err
    for bad in ("0,4", "5,3"):
        with pytest.raises(SystemExit, match="expected N from 1, low then high"):
            main(["train", "qos", "--experts-range", bad, "--steps", "1"])


def test_a_latency_range_is_low_then_high(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    assert parser.parse_args(["train", "qos", "--latencies", "15,40"]).latencies == (15.0, 40.0)
    for bad in ("30,20", "0,20", "20", "a,b"):
        with pytest.raises(SystemExit):
            parser.parse_args(["train", "qos", "--latencies", bad])
        assert "--latencies: expected" in capsys.readouterr().err
    over = parser.parse_args(["train", "qos", "--latency-over-fastest", "1,2"])
    assert over.latency_over_fastest == (1.0, 2.0)
    assert parser.parse_args(["train", "qos"]).latency_over_fastest is None
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "qos", "--latency-over-fastest", "2,1"])
    assert "--latency-over-fastest: expected" in capsys.readouterr().err
    args = parser.parse_args(["train", "qos", "--hardware-ms", "10,40"])
    assert args.hardware_ms == (10.0, 40.0)
    assert parser.parse_args(["train", "qos"]).hardware_ms == (10.0, 22.0)  # the paper's
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "qos", "--hardware-ms", "40,10"])
    assert "--hardware-ms: expected LO,HI low then high" in capsys.readouterr().err


def test_training_and_the_benchmarks_draw_the_same_fleet_from_the_same_options() -> None:
    """An agent is measured in the world it trained in: `train qos`, `bench qos` and
    `bench qos-impact` read one set of fleet options, and a fleet's own flags (as a
    results file's command shows them) select it again."""
    parser = build_parser()
    big = Fleet(hardware_ms=(20.0, 40.0), running_cap=256, waiting_cap=1000, memory_tokens=40_000)
    flags = big.flags().split()
    assert flags == [
        "--hardware-ms", "20,40", "--running-cap", "256",
        "--memory-tokens", "40000", "--waiting-cap", "1000",
    ]  # fmt: skip
    for command in (["train", "qos"], ["bench", "qos"], ["bench", "qos-impact"]):
        assert fleet_from(parser.parse_args([*command, *flags])) == big
        assert fleet_from(parser.parse_args(command)) == Fleet()
    assert Fleet().flags() == "" and Fleet().suffix() == ""
    assert big.suffix() == "_fleet-20-40ms-b256-m40000-w1000"


def test_a_scrape_interval_is_a_positive_span(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    for command in (["train", "qos"], ["bench", "qos"], ["bench", "qos-impact"]):
        assert parser.parse_args([*command, "--scrape-ms", "200"]).scrape_ms == 200.0
        assert parser.parse_args(command).scrape_ms is None  # exact state / the gateway's own
        for bad in ("0", "-5", "soon"):
            with pytest.raises(SystemExit):
                parser.parse_args([*command, "--scrape-ms", bad])
            assert "--scrape-ms: expected" in capsys.readouterr().err


def test_no_drop_trains_without_the_drop_action() -> None:
    from edgeroute.cli import train_config

    parser = build_parser()
    assert train_config(parser.parse_args(["train", "qos"])).drop is True
    no_drop = train_config(parser.parse_args(["train", "qos", "--no-drop"]))
    assert no_drop.drop is False and no_drop.sac().drop is False
    assert train_config(parser.parse_args(["train", "qos"])).episode_len == 256
    long = train_config(parser.parse_args(["train", "qos", "--episode-len", "1000"]))
    assert long.episode_len == 1000
    with pytest.raises(ValueError, match="at least one decision"):
        train_config(parser.parse_args(["train", "qos", "--episode-len", "0"]))


def test_keep_chooses_the_exported_actor(capsys: pytest.CaptureFixture[str]) -> None:
    from edgeroute.cli import train_config

    parser = build_parser()
    assert train_config(parser.parse_args(["train", "qos"])).keep == "best"
    assert train_config(parser.parse_args(["train", "qos", "--keep", "last"])).keep == "last"
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "qos", "--keep", "first"])
    assert "--keep: invalid choice" in capsys.readouterr().err


def test_the_replay_size_reaches_the_learner() -> None:
    from edgeroute.cli import train_config

    parser = build_parser()
    assert train_config(parser.parse_args(["train", "qos"])).sac().buffer == 50_000
    whole = train_config(parser.parse_args(["train", "qos", "--buffer", "150000"]))
    assert whole.buffer == 150_000 and whole.sac().buffer == 150_000
    with pytest.raises(ValueError, match="at least one transition"):
        train_config(parser.parse_args(["train", "qos", "--buffer", "0"]))


def test_the_evaluation_takes_at_least_one_episode() -> None:
    parser = build_parser()
    assert (
        train_config(parser.parse_args(["train", "qos", "--eval-episodes", "2"])).eval_episodes == 2
    )
    with pytest.raises(ValueError, match="at least one episode, not 0"):
        train_config(parser.parse_args(["train", "qos", "--eval-episodes", "0"]))


@pytest.mark.parametrize(
    ("flag", "bad"),
    [
        (flag, bad)
        for flag in ("--rate", "--latency-ms", "--seeds", "--engines", "--speedup", "--time-scale")
        for bad in ("0", "-2", "soon")
    ],
)
def test_bench_qos_refuses_a_count_or_span_that_is_not_positive(
    flag: str, bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "qos", "--live", flag, bad])
    assert f"{flag}: expected" in capsys.readouterr().err


def test_a_rollouts_lookahead_and_rates_reach_the_benchmark(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[tuple[Any, ...]] = []
    monkeypatch.setattr("edgeroute.bench.qos_rollout.main", lambda *a: seen.append(a))
    args = build_parser().parse_args(
        shlex.split("bench qos-rollout --rates 5,8 --horizon 16 --truth --own --model a=x,y")
    )
    args.func(args)
    ((_, _, _, _, models, rates, look, quality, _),) = seen
    assert models == {"a": [Path("x"), Path("y")]} and rates == [5.0, 8.0]
    assert (look.horizon, look.futures, look.believed, look.own) == (16, 1, False, True)
    assert quality == "routerdc"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "qos-rollout", "--rates", "5,0", "--model", "a=x"])
    assert "--rates: expected" in capsys.readouterr().err


def test_a_live_rate_is_only_for_live_runs() -> None:
    parser = build_parser()
    assert parser.parse_args(["bench", "qos", "--live", "--rate", "8"]).rate == 8.0
    args = parser.parse_args(["bench", "qos", "--rate", "8"])
    with pytest.raises(SystemExit, match="--rate is for --live runs"):
        args.func(args)


def test_a_live_latency_target_engine_count_and_speedup_reach_the_live_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import edgeroute.bench.qos_live

    parser = build_parser()
    seen: list[object] = []
    monkeypatch.setattr(
        edgeroute.bench.qos_live,
        "main",
        lambda run, _: seen.append(
            tuple(run.config[k] for k in ("latency_ms", "engines", "speedup"))
        ),
    )
    for argv in (
        ["--live"],
        ["--live", "--latency-ms", "40", "--engines", "12", "--speedup", "5"],
    ):
        args = parser.parse_args(["bench", "qos", *argv])
        args.func(args)
    assert seen == [(30.0, 6, 10.0), (40.0, 12, 5.0)]  # 6: the live run's own


def test_bench_qos_seeds_count_environment_seeds_in_either_mode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import edgeroute.bench.qos
    import edgeroute.bench.qos_live

    parser = build_parser()
    seen: dict[str, object] = {}

    def simulated(*args: object, **kwargs: object) -> None:
        seen["simulated"] = kwargs["n_seeds"]

    def live(run: LivePlan, _: object) -> None:
        seen["live"] = len(run.config["seeds"])

    monkeypatch.setattr(edgeroute.bench.qos, "main", simulated)
    monkeypatch.setattr(edgeroute.bench.qos_live, "main", live)
    for argv, mode, expected in (
        ([], "simulated", None),  # the sweep's own 10
        (["--seeds", "30"], "simulated", 30),
        (["--live"], "live", 3),
        (["--live", "--seeds", "20"], "live", 20),
    ):
        seen.clear()
        args = parser.parse_args(["bench", "qos", *argv])
        args.func(args)
        assert seen == {mode: expected}, argv


@pytest.mark.parametrize(
    ("argv", "refused"),
    [
        (["qos", "--max-batch", "5"], "--max-batch is for --live runs"),
        (["qos", "--latency-ms", "40"], "--latency-ms is for --live runs"),
        (["qos", "--engines", "12"], "--engines is for --live runs"),
        (["qos", "--speedup", "5"], "--speedup is for --live runs"),
        (["qos", "--predict"], "--predict is for --live runs"),
        (["qos", "--send-late-ms", "10"], "--send-late-ms and --draws are for --live --predict"),
        (["qos", "--live", "--draws", "3"], "are for --live --predict: a live run's sends"),
        (["qos", "--live", "--send-late-ms", "10"], "are for --live --predict: a live run's"),
        (["qos", "--live", "--predict", "--draws", "3"], "more only with a mean lateness"),
        (["qos", "--live", "--predict", "--send-late-ms", "-1"], "must be finite and >= 0"),
        (["qos-replay", "x.json", "--send-late-ms", "inf"], "must be finite and >= 0"),
        (["qos", "--live", "--hardware-ms", "20,40"], "--hardware-ms is for simulated runs"),
        (["qos", "--live", "--running-cap", "256"], "--running-cap is for simulated runs"),
        (["qos", "--live", "--waiting-cap", "1000"], "--waiting-cap is for simulated runs"),
        (["qos", "--live", "--memory-tokens", "40000"], "--memory-tokens is for simulated runs"),
        (["qos", "--live", "--trace", "azure.csv"], "--trace is for simulated runs"),
        (["qos", "--live", "--time-scale", "1.02"], "--time-scale is for simulated runs"),
        (["qos", "--live", "--prefix-cache"], "--prefix-cache is for simulated runs"),
        (["qos", "--live", "--held-out-hardware"], "--held-out-hardware is for simulated runs"),
        (["qos", "--live", "--engine-hardware"], "--engine-hardware is for simulated runs"),
        (
            ["qos", "--engine-hardware", "--held-out-hardware"],
            "each puts every point elsewhere",
        ),
        (
            ["qos", "--engine-hardware", "--running-cap", "256"],
            "--running-cap does nothing with --engine-hardware",
        ),
        (
            ["qos-impact", "--engine-hardware", "--held-out-hardware"],
            "each puts every point elsewhere",
        ),
        (
            ["qos-impact", "--engine-hardware", "--hardware-ms", "20,40"],
            "--hardware-ms does nothing with --engine-hardware",
        ),
    ],
)
def test_the_qos_benchmarks_refuse_an_option_their_run_would_ignore(
    argv: list[str], refused: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Refused before anything runs: a results file must not name a setting its run lacked.
    import edgeroute.bench.qos
    import edgeroute.bench.qos_impact
    import edgeroute.bench.qos_live

    def ran(*args: object, **kwargs: object) -> None:
        raise AssertionError("the run started")

    for module in (edgeroute.bench.qos, edgeroute.bench.qos_live, edgeroute.bench.qos_impact):
        monkeypatch.setattr(module, "main", ran)
    args = build_parser().parse_args(["bench", *argv])
    with pytest.raises(SystemExit, match=refused):
        args.func(args)


def _trained(flags: str) -> TrainConfig:
    return train_config(build_parser().parse_args(["train", "qos", *shlex.split(flags)]))


def test_a_configs_flags_give_it_back_through_the_command_line() -> None:
    """`TrainConfig.flags` (what a model card prints to rebuild a run) parsed by `train
    qos` is the config again: for every setting changed at once, and for every
    committed run's record."""
    changed = TrainConfig(
        variant="dsa",
        quality="routerdc",
        experts=3,
        experts_range=(2, 5),
        rate=4.0,
        latency_ms=25.0,
        credit="completion",
        impact="pushed",
        impact_scale=2.5,
        impact_scale_by_rate=(0.5, 2.0),
        randomise=False,
        rates=(2.0, 10.0),
        latencies_ms=(10.0, 30.0),
        latency_over_fastest=(1.0, 3.5),
        fleet=Fleet(hardware_ms=(5.0, 9.0), running_cap=7, waiting_cap=9, memory_tokens=999),
        scrape_ms=500.0,
        drop=False,
        speed_prior=True,
        steps=1000,
        warmup=100,
        envs=4,
        update_every=2,
        batch=8,
        buffer=77,
        eval_every=50,
        eval_episodes=2,
        select_on="sweep",
        keep="last",
        episode_len=30,
        seed=7,
        zero_predictions=True,
        lr=0.001,
        gamma=0.9,
        target_entropy_ratio=0.25,
        init_alpha=0.1,
        hidden=16,
        heads=1,
        layers=2,
        arrival_rate=True,
        critic_arrival_rate=True,
        herded_starts=0.25,
        trace="mooncake/conversation_trace.jsonl.gz",
        trace_share=0.5,
        predictor="models/qos/routerdc/expected-read",
    )
    default = TrainConfig()
    # a setting added to TrainConfig must be changed above, or have no option
    unchanged = {
        f.name for f in fields(default) if getattr(changed, f.name) == getattr(default, f.name)
    }
    assert unchanged == {"threads"}
    assert _trained(changed.flags()) == changed
    assert _trained(default.flags()) == default and default.flags() == ""
    records = sorted(MODEL_ROOT.rglob(RECORD))
    assert len(records) > 90
    for path in records:
        config = TrainConfig.from_record(read_record(path.parent)["config"])
        assert _trained(config.flags()) == config, path


def test_every_serving_flag_reaches_the_live_runs_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """`bench qos` reads each flag of SERVING_FLAGS by its own option (the CLI derives
    the option's name from the flag), so an agent it names is served so live."""
    import edgeroute.bench.qos_live
    from edgeroute.bench.qos import SERVING_FLAGS

    parser = build_parser()
    seen: list[object] = []
    monkeypatch.setattr(edgeroute.bench.qos_live, "main", lambda run, _: seen.append(run.serving))
    agent = MODEL_ROOT / "routerdc" / "engines"  # the plan refuses one of another world
    argv = ["bench", "qos", "--live", "--quick", "--quality", "routerdc", "--model", f"a={agent}"]
    for flag, _ in SERVING_FLAGS.values():
        argv += [flag, "a"]
    args = parser.parse_args(argv)
    args.func(args)
    assert seen == [{"a": {param: value for param, (_, value) in SERVING_FLAGS.items()}}]


def test_the_speed_prior_reaches_the_training_environments_and_the_record() -> None:
    from edgeroute.cli import train_config
    from edgeroute.qos.config import TrainConfig
    from edgeroute.qos.train import experts_for, make_env
    from edgeroute.sim.edge import NoisyOracle, Task

    parser = build_parser()
    assert train_config(parser.parse_args(["train", "qos"])).speed_prior is False
    cfg = train_config(parser.parse_args(["train", "qos", "--speed-prior"]))
    assert cfg.speed_prior is True and cfg.flags() == " --speed-prior"
    assert train_config(parser.parse_args(["train", "qos", *cfg.flags().split()])) == cfg
    models = {e.model for e in experts_for(cfg, 0)}
    tasks = [Task("p", 100, dict.fromkeys(models, 1.0), dict.fromkeys(models, 10))]
    env = make_env(cfg, Path("unused"), predictor=NoisyOracle(), tasks=tasks)
    assert env.speed_prior is True
    # records from before the setting had it off
    assert TrainConfig.from_record({"variant": "full"}).speed_prior is False
