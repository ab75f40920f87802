"""`bench qos-shares`: where each policy sends its requests on the engines, and what
each engine gives back."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from edgeroute.bench.qos import Sweep
from edgeroute.bench.qos_shares import engine_shares, main
from edgeroute.qos.evaluate import BASELINES, evaluate
from edgeroute.sim.edge import QUALITY_MODELS, EdgeEnv, engine_fleet
from edgeroute.sim.workload import read_azure
from policies.predictor import MODEL_ROOT
from tests.support import DATA_DIR, needs_data, routerdc_sweep, write_trace
from workers.profiles import PROFILES

SEEDS = [3, 4]


def _sweep() -> Sweep:
    return routerdc_sweep(hardware="engines", episode=96, scrape_ms=1000)


@needs_data("the RouterDC data")
def test_the_engines_shares_add_up_to_the_qos_evaluate_gives() -> None:
    """SQF drops nothing, so every arrival is on some engine: the shares sum to 1, the
    shares weighted by each engine's QoS are the policy's QoS, and that is `evaluate`'s
    on the same seeds."""
    sweep = _sweep()
    shares, _, qos = engine_shares(sweep, [BASELINES["SQF"]], SEEDS, 6, 5.0, 30.0)
    assert math.isclose(sum(s.sent for s in shares), 1.0)
    assert math.isclose(sum(s.sent * (s.qos or 0.0) for s in shares), qos)
    evaluated = [
        evaluate(sweep.env(k, rate=5.0, latency_ms=30.0), BASELINES["SQF"], [seed]).qos
        for k, seed in enumerate(SEEDS)
    ]
    assert qos == statistics.fmean(evaluated)
    assert all(s.met is not None and s.qos is not None and s.qos <= s.met for s in shares)


@needs_data("the RouterDC data")
def test_the_split_by_load_adds_up_to_each_engines_share() -> None:
    """Every arrival is decided once with each engine at some count, and the requests
    sent there at each count add up to the engine's share and its share meeting L."""
    measured = engine_shares(_sweep(), [BASELINES["SQF"]], SEEDS, 6, 8.0, 30.0)
    per_engine = {
        s.engine: [b for b in measured.by_load if b.engine == s.engine] for s in measured.shares
    }
    decisions = {sum(b.decisions for b in rows) for rows in per_engine.values()}
    assert len(decisions) == 1  # the same arrivals, counted once per engine
    total = decisions.pop()
    for share in measured.shares:
        rows = per_engine[share.engine]
        sent = sum(b.decisions * b.sent for b in rows)
        assert math.isclose(sent, share.sent * total)
        if sent:
            met = sum(b.decisions * b.sent * (b.met or 0.0) for b in rows)
            assert math.isclose(met / sent, share.met or 0.0)
    # at lambda = 8 some engine holds more than a bucket's worth at some arrival
    assert any(b.in_flight != "0-4" for b in measured.by_load)


@needs_data("the RouterDC data")
def test_the_split_by_load_reads_the_count_as_the_request_arrives() -> None:
    """A policy that sends the first engine a request only while it holds fewer than
    five, and the second otherwise, sends the first everything it decides at 0-4 and
    nothing at any higher count."""

    def spill(env: EdgeEnv, i: int) -> int:
        return 1 if env.experts[0].in_flight < 5 else 2

    measured = engine_shares(_sweep(), [spill], SEEDS, 6, 8.0, 30.0)
    first = [b for b in measured.by_load if b.engine == measured.shares[0].engine]
    assert (first[0].in_flight, first[0].sent) == ("0-4", 1.0)
    assert len(first) > 1 and all(b.sent == 0.0 and b.met is None for b in first[1:])


@needs_data("the RouterDC data")
def test_a_policy_that_sends_everything_to_one_engine_has_it_all_there() -> None:
    def first(env: EdgeEnv, i: int) -> int:
        return 1

    shares, _, _ = engine_shares(_sweep(), [first], SEEDS, 6, 5.0, 30.0)
    assert [s.sent for s in shares] == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert all(s.score is None and s.met is None and s.qos is None for s in shares[1:])


@needs_data("the RouterDC data")
def test_an_engine_slower_per_iteration_than_l_never_meets_it() -> None:
    """Round-robin sends to every engine; one whose iteration alone takes longer than
    L per token cannot meet L, whatever its load, and earns nothing."""
    shares, _, _ = engine_shares(_sweep(), [BASELINES["RR"]], SEEDS, 6, 5.0, 30.0)
    profiles = [profile for profile, _ in engine_fleet(QUALITY_MODELS["routerdc"], 6)]
    slow = [s for s, p in zip(shares, profiles, strict=True) if PROFILES[p].base > 0.030]
    assert slow, "the engines' fleet has profiles slower than 30 ms an iteration"
    assert all(s.sent > 0 and s.met == 0.0 and s.qos == 0.0 for s in slow)
    assert any(s.met for s in shares)


@needs_data("the RouterDC data")
def test_the_command_writes_its_table_with_every_policy_on_every_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EDGEROUTE_DATA_DIR", str(DATA_DIR))
    out = tmp_path / "shares.json"
    main(True, 1, 1, str(out), {}, "routerdc", 1000.0, n=3, rate=8.0)
    written = json.loads(out.read_text())
    assert (
        written["benchmark"]
        == "qos_shares_routerdc_scrape-1000ms_N-3_lambda-8_L-30ms_seed-1_seeds-1"
    )
    assert written["config"]["command"] == (
        "edgeroute bench qos-shares --quality routerdc --scrape-ms 1000 --n 3 --rate 8 "
        "--latency-ms 30 --seed 1 --seeds 1"
    )
    policies = {r["policy"] for r in written["results"]}
    assert policies == {"BR", "RR", "SQF", "SQF+predicted", "least_load"}
    assert len(written["results"]) == 3 * len(policies)
    by_load = json.loads((tmp_path / "shares_by-load.json").read_text())
    assert by_load["benchmark"] == written["benchmark"] + "_by-load"
    assert {r["policy"] for r in by_load["results"]} == policies
    assert {r["in_flight"] for r in by_load["results"]} >= {"0-4"}


@needs_data("the RouterDC data")
def test_with_a_trace_the_episodes_read_its_windows_and_the_command_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--trace`: every episode reads its window of the trace (the shares' QoS is
    `evaluate`'s on the trace point), and the results name the trace and the predictor
    the agent trained with."""
    trace = write_trace(tmp_path / "trace.csv", 400)
    sweep = routerdc_sweep(trace=read_azure(trace), hardware="engines", episode=96, scrape_ms=1000)
    _, _, qos = engine_shares(sweep, [BASELINES["SQF"]], SEEDS, 3, 5.0, 30.0)
    on_trace = [
        evaluate(sweep.env(k, n=3, arrivals=True), BASELINES["SQF"], [seed]).qos
        for k, seed in enumerate(SEEDS)
    ]
    poisson = [
        evaluate(sweep.env(k, n=3), BASELINES["SQF"], [seed]).qos for k, seed in enumerate(SEEDS)
    ]
    assert qos == statistics.fmean(on_trace) != statistics.fmean(poisson)

    monkeypatch.setenv("EDGEROUTE_DATA_DIR", str(DATA_DIR))
    folder = MODEL_ROOT / "routerdc" / "expected-read"
    out = tmp_path / "shares.json"
    main(
        True,
        1,
        2,
        str(out),
        {"full": [folder]},
        "routerdc",
        1000.0,
        n=3,
        trace=trace,
        predictor=folder,
    )
    written = json.loads(out.read_text())
    assert "_trace-trace_predictor-expected-read_full" in written["benchmark"]
    command = written["config"]["command"]
    assert f"--trace {trace} --predictor models/qos/routerdc/expected-read --model full=" in command
