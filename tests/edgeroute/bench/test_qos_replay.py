"""`bench qos-replay`: a live run's own streams in the simulator."""

from __future__ import annotations

import itertools
import json
import math
import re
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edgeroute.bench.qos import Physics, recorded_serving
from edgeroute.bench.qos_live import live_stream
from edgeroute.bench.qos_replay import (
    Lateness,
    Replay,
    recorded_quality,
    replayed,
)
from edgeroute.qos.evaluate import BASELINES, evaluate
from edgeroute.results_io import output_dir
from edgeroute.sim.edge import Task
from tests.support import needs_data

LIVE = "qos_live_routerdc_rate-8_seed-3301_last5-full_last5-dsa_last5-baseline"


def _committed(name: str) -> dict[str, Any]:
    payload: dict[str, Any] = json.loads((output_dir(False) / f"{name}.json").read_text())
    return payload


def test_the_live_runs_world_and_serving_are_read_from_its_record() -> None:
    assert recorded_quality({"quality": "routerdc", "command": ""}) == "routerdc"
    # files from before the config recorded it: the command says it, or the default
    assert recorded_quality({"command": "edgeroute bench qos --live --quality routerdc"}) == (
        "routerdc"
    )
    assert recorded_quality({"command": "edgeroute bench qos --live"}) == "routerbench"
    command = "edgeroute bench qos --live --model a=x --model b=y --no-shed b --sample a --sample b"
    assert recorded_serving(command) == {
        "b": {"shed": False, "sample": True},
        "a": {"sample": True},
    }
    assert recorded_serving("edgeroute bench qos --live --model a=x") == {}


@needs_data("the RouterDC data")
def test_a_replayed_stream_routes_every_live_request_at_its_instant() -> None:
    """Every request of the seed's stream is routed once, in order, at its instant and
    with its own prompt, and every one finishes; the sentinel after the last is not
    routed. Replaying again gives the same episode."""
    config = {**_committed(LIVE)["config"], "seeds": [7], "requests_per_seed": 60}
    replay = Replay(config, Physics())
    tasks, gaps = live_stream(replay.sweep.tasks, 7, 60, config["rate"])
    stream = replayed(tasks, gaps)
    assert len(stream) == 61 and stream[-1] == stream[-2]
    env = replay.sweep.env(0, config["engines"], config["rate"], 30.0, stream=stream)
    routed: list[tuple[float, str]] = []

    def recording(env: Any, i: int) -> int:
        routed.append((env.now, env.task.prompt))
        action: int = BASELINES["RR"](env, i)
        return action

    first = evaluate(env, recording, [7])
    assert routed == [
        (t, task.prompt) for t, task in zip(itertools.accumulate(gaps), tasks, strict=True)
    ]
    assert len(env.finished) == 60 and first.drop_rate == 0
    assert evaluate(env, BASELINES["RR"], [7]) == first


@needs_data("the RouterDC data")
def test_the_committed_replay_is_what_this_code_gives() -> None:
    """(74)'s replay of the lambda = 8 live run, with the engines 2% slower and their
    prefix caches, gives the committed per-seed QoS for RR and least-load exactly."""
    committed = _committed(LIVE.replace("qos_live_", "qos_replay_") + "_time-x1.02_prefix-cache")
    replay = Replay(_committed(LIVE)["config"], Physics(1.02, prefix_cache=True))
    policies = replay.policies()
    rows = {r["policy"]: r for r in committed["results"]}
    for name in ("RR", "least_load"):
        sim, skipped = replay.run(policies[name])
        assert sim == rows[name]["per_seed_sim_qos"]
        assert f"{skipped:.0%}" == rows[name]["prefill_skipped"]


TWELVE = "qos_live_routerdc_engines-12_rate-10_seed-3461_last5-full_last5-dsa_last5-baseline"


@needs_data("the RouterDC data")
def test_a_speed_prior_spreads_an_agent_that_herded_onto_the_engine_it_measured_first() -> None:
    """(94)'s herding, replayed: dsa's run s3 on (91)'s ninth seed (twelve engines,
    lambda = 10), its requests sent about 10 ms late, sends most of them to one engine
    and never measures most of the others. Read at the mean measured speed, they get
    requests, and the episode's QoS rises."""
    from collections import Counter

    from edgeroute.qos.evaluate import served
    from policies.qos_drl import load

    live = _committed(TWELVE)["config"]
    replay = Replay(live, Physics(1.02, prefix_cache=True), Lateness(10))
    seed, run = live["seeds"][8], Path(__file__).parents[3] / live["models"]["last5-dsa"][3]
    tasks, gaps = live_stream(replay.sweep.tasks, seed, live["requests_per_seed"], live["rate"])
    (stream,) = replay.lateness.streams(tasks, gaps, seed)

    def episode(prior: bool) -> tuple[float, float]:
        """The episode's QoS and the busiest engine's share of its requests."""
        act = served(load(run, live["latency_ms"], speed_prior=prior))
        picks: Counter[int] = Counter()

        def counting(env: Any, i: int) -> int:
            picks[action := act(env, i)] += 1
            return action

        env = replay.sweep.env(0, live["engines"], live["rate"], live["latency_ms"], stream=stream)
        qos = evaluate(env, counting, [seed]).qos
        return qos, max(picks.values()) / picks.total()

    (herded, top), (spread, top_with_prior) = episode(False), episode(True)
    assert top > 0.8 and top_with_prior < 0.65
    assert spread > herded + 0.2


def test_a_live_run_with_capped_batches_is_refused() -> None:
    with pytest.raises(ValueError, match="capped batch is not supported"):
        Replay({"max_batch": 5, "command": ""}, Physics())


@needs_data("the RouterDC data")
@pytest.mark.parametrize(
    ("edit", "refused"),
    [
        (
            lambda d: d.update(config={**d["config"], "command": "edgeroute bench qos"}),
            "qos --live",
        ),
        (lambda d: d["config"].pop("requests_per_seed"), "no requests_per_seed"),
        (lambda d: d["results"][0].update(per_seed_qos=[0.1]), "not given for each of 10 seeds"),
        (lambda d: d.update(results=d["results"][1:]), "no live QoS of ['RR']"),
        (lambda d: d.pop("results"), "not a results file"),
    ],
)
def test_a_file_that_is_not_a_live_runs_results_is_refused_by_name(
    tmp_path: Path, edit: Callable[[dict[str, Any]], object], refused: str
) -> None:
    """A simulated sweep's results, a truncated file, or one that lacks a policy's
    per-seed QoS: a clear refusal naming the file, not a traceback."""
    from edgeroute.bench.qos_replay import main

    data = _committed(LIVE)
    edit(data)
    path = tmp_path / "live.json"
    path.write_text(json.dumps(data))
    with pytest.raises(SystemExit, match=re.escape(refused)) as caught:
        main(path, Physics(), None)
    assert str(path) in str(caught.value)
    path.write_text("{not json")
    with pytest.raises(SystemExit, match="not a results file"):
        main(path, Physics(), None)


def test_a_live_runs_plan_is_what_its_results_file_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The settings of the committed paced run at N = 12, lambda = 10 ((91)), planned
    again without running it, give its recorded name and config: the same seeds,
    streams' parameters and agents. So a prediction made from the settings alone runs
    that run's own streams."""
    from edgeroute.bench.qos_live import plan
    from edgeroute.results_io import ROOT

    name = "qos_live_routerdc_engines-12_rate-10_seed-3461_last5-full_last5-dsa_last5-baseline"
    recorded = _committed(name)
    config = {k: v for k, v in recorded["config"].items() if k != "machine"}
    monkeypatch.chdir(ROOT)  # the models as the command gave them, from the checkout
    runs = {k: [Path(d) for d in v] for k, v in config["models"].items()}
    planned = plan(False, 3461, runs, rate=10.0, n_seeds=10, quality="routerdc", engines=12)
    assert planned.name == recorded["benchmark"] == name
    assert planned.config == config


@needs_data("the RouterDC data")
def test_a_prediction_runs_the_planned_streams_in_the_simulator_and_serves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`bench qos --live --predict` starts no engine and no gateway; it writes every
    policy's predicted QoS per seed under its own name, recording the live command it
    predicts and the simulated world, and the figures are the replay's of those streams."""
    from edgeroute.bench import qos_live
    from edgeroute.cli import build_parser

    def served(*_: object, **__: object) -> None:
        raise AssertionError("a prediction started a live run")

    monkeypatch.setattr(qos_live, "run_policy", served)
    out = tmp_path / "predicted.json"
    argv = "bench qos --live --predict --quick --quality routerdc --seed 7 --rate 8"
    args = build_parser().parse_args(
        [*argv.split(), "--time-scale", "1.02", "--prefix-cache", "--json", str(out)]
    )
    args.func(args)
    written = json.loads(out.read_text())
    assert written["benchmark"] == "qos_predicted_routerdc_rate-8_seed-7_time-x1.02_prefix-cache"
    config = written["config"]
    assert config["command"] == (
        "edgeroute bench qos --live --predict --quick --quality routerdc --rate 8 --seed 7"
        " --time-scale 1.02 --prefix-cache"
    )
    assert config["live"]["seeds"] == [7] and config["live"]["requests_per_seed"] == 100
    rows = {r["policy"]: r for r in written["results"]}
    agents = list(config["live"]["models"])
    assert list(rows) == ["RR", "least_load", "BR", *agents] and len(agents) >= 2
    replay = Replay(config["live"], Physics(1.02, prefix_cache=True))
    assert rows["RR"]["per_seed_qos"] == replay.run(replay.policies()["RR"])[0]
    assert all(len(r["per_seed_qos"]) == 1 for r in rows.values())
    assert rows[agents[0]]["paired_minus_agents"].startswith(f"{agents[1]}: ")


def test_a_prediction_of_a_run_with_capped_batches_is_refused() -> None:
    from edgeroute.bench.qos_live import plan
    from edgeroute.bench.qos_replay import predict

    with pytest.raises(SystemExit, match="capped batch is not supported"):
        predict(plan(True, 1, {}, quality="routerdc", max_batch=5), Physics(), None)


def _pool(n: int) -> list[Task]:
    return [Task(f"prompt {i}", 10 + i, {}, {}) for i in range(n)]


def test_sends_replayed_late_keep_their_order_and_are_never_early() -> None:
    """On time, a seed's stream is the replay's own; late, every request comes at or
    after its instant, in the order sent, with its own prompt, and the draws are the
    same in every run but differ from each other."""
    tasks, gaps = live_stream(_pool(50), 3, 500, 5.0)
    instants = list(itertools.accumulate(gaps))
    assert Lateness().streams(tasks, gaps, 3) == [replayed(tasks, gaps)]
    draws = Lateness(10.0, 3).streams(tasks, gaps, 3)
    assert draws == Lateness(10.0, 3).streams(tasks, gaps, 3)
    assert len(draws) == 3 and draws[0] != draws[1]
    for stream in draws:
        sent = stream[:-1]
        assert [a.task for a in sent] == tasks and stream[-1] == sent[-1]
        times = [a.t for a in sent]
        assert times == sorted(times)
        assert all(t >= at for t, at in zip(times, instants, strict=True))
        late_ms = statistics.fmean(t - at for t, at in zip(times, instants, strict=True)) * 1000
        assert 5 < late_ms < 40  # an exponential of mean 10 ms, pushed later by order kept


@pytest.mark.parametrize(
    ("mean_ms", "draws", "refused"),
    [
        (-1.0, 1, "finite and >= 0"),
        (math.nan, 1, "finite and >= 0"),
        (math.inf, 1, "finite and >= 0"),
        (10.0, 0, "at least one"),
        (0.0, 2, "more only with a mean lateness above 0"),
    ],
)
def test_a_lateness_that_cannot_be_drawn_is_refused(
    mean_ms: float, draws: int, refused: str
) -> None:
    with pytest.raises(ValueError, match=refused):
        Lateness(mean_ms, draws)


@needs_data("the RouterDC data")
def test_a_prediction_with_late_sends_is_named_and_recorded_so(tmp_path: Path) -> None:
    from edgeroute.cli import build_parser

    out = tmp_path / "late.json"
    argv = "bench qos --live --predict --quick --quality routerdc --seed 7 --rate 8"
    args = build_parser().parse_args(
        [*argv.split(), "--send-late-ms", "10", "--draws", "2", "--json", str(out)]
    )
    args.func(args)
    written = json.loads(out.read_text())
    assert written["benchmark"] == "qos_predicted_routerdc_rate-8_seed-7_late-10ms-x2"
    assert written["config"]["command"].endswith(" --send-late-ms 10 --draws 2")
    assert (written["config"]["send_late_ms"], written["config"]["draws"]) == (10.0, 2)
