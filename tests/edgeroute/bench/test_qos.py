"""`bench qos`: agents given by hand are results of their own."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
from pathlib import Path
from typing import Any

import pytest

from edgeroute.bench.qos import (
    BOUND,
    Physics,
    agents_named,
    judge,
    main,
    recorded_serving,
    scrape_named,
    serving_from,
    timed_trace,
    trace_named,
    variant_named,
)
from edgeroute.sim.edge import EdgeEnv
from edgeroute.stats import shown
from policies.predictor import MODEL_ROOT
from tests.support import DATA_DIR, needs_data, routerdc_sweep, synthetic_mooncake, write_trace


def test_agents_given_by_hand_get_their_own_results_and_flags() -> None:
    assert agents_named("qos_routerdc", {}) == ("qos_routerdc", "")
    name, flags = agents_named(
        "qos_live", {"wide": [Path("a/full-s0"), Path("a/full-s1")], "my run!": [Path("b")]}
    )
    assert name == "qos_live_wide_my-run-"
    assert flags == " --model wide=a/full-s0,a/full-s1 --model my run!=b"
    serving = serving_from({"shed": ["b"], "sample": ["a", "b"], "speed_prior": ["a"]})
    assert serving == {
        "b": {"shed": False, "sample": True},
        "a": {"sample": True, "speed_prior": True},
    }
    _, flags = agents_named("qos", {"a": [Path("a")], "b": [Path("b")]}, serving)
    assert flags == (" --model a=a --model b=b --no-shed b --sample a --sample b --speed-prior a")
    assert recorded_serving(f"edgeroute bench qos{flags}") == serving


def test_only_an_agent_given_by_hand_can_be_served_otherwise() -> None:
    from edgeroute.bench.qos import check_serving

    check_serving({"a": [Path("a")]}, serving_from({"shed": ["a"], "sample": ["a"]}))
    with pytest.raises(SystemExit, match="--no-shed b: no such agent"):
        check_serving({"a": [Path("a")]}, serving_from({"shed": ["b"]}))
    with pytest.raises(SystemExit, match="--sample b, c: no such agent"):
        check_serving({"a": [Path("a")]}, serving_from({"shed": ["a"], "sample": ["c", "b"]}))
    with pytest.raises(SystemExit, match="--speed-prior c: no such agent"):
        check_serving({"a": [Path("a")]}, serving_from({"speed_prior": ["c"]}))


def test_a_simulation_seen_through_scrapes_writes_results_of_its_own() -> None:
    assert scrape_named("qos_routerdc", None) == ("qos_routerdc", "")
    assert scrape_named("qos", 1000.0) == ("qos_scrape-1000ms", " --scrape-ms 1000")


def test_other_hardware_draws_and_seeds_write_results_of_their_own() -> None:
    assert variant_named("qos") == ("qos", "")
    assert variant_named("qos", 1, "held-out") == ("qos_held-out-hw", " --held-out-hardware")
    assert variant_named("qos", 1, "engines") == ("qos_engine-hw", " --engine-hardware")
    assert variant_named("qos", 7) == ("qos_seed-7", " --seed 7")
    assert variant_named("qos", 7, "held-out") == (
        "qos_held-out-hw_seed-7",
        " --held-out-hardware --seed 7",
    )
    assert variant_named("qos", seeds=30) == ("qos_seeds-30", " --seeds 30")
    assert variant_named("qos", 1, "held-out", 30) == (
        "qos_held-out-hw_seeds-30",
        " --held-out-hardware --seeds 30",
    )
    assert variant_named("qos", 1, "engines", 60, Physics(1.02)) == (
        "qos_engine-hw_time-x1.02_seeds-60",
        " --engine-hardware --time-scale 1.02 --seeds 60",
    )
    assert variant_named("qos", 1001, "engines", 60, Physics(1.02, prefix_cache=True)) == (
        "qos_engine-hw_time-x1.02_prefix-cache_seed-1001_seeds-60",
        " --engine-hardware --time-scale 1.02 --prefix-cache --seed 1001 --seeds 60",
    )
    assert variant_named("qos", physics=Physics(prefix_cache=True)) == (
        "qos_prefix-cache",
        " --prefix-cache",
    )
    with pytest.raises(ValueError, match="time scale must be > 0"):
        Physics(0.0)


@needs_data("the RouterDC data")
def test_held_out_hardware_moves_every_point_off_hardware_seed_0(tmp_path: Path) -> None:
    """A quick sweep (the default point and the trace, one environment seed) on held-out
    hardware: its command says so, and the same policy on the same requests scores
    otherwise than on hardware seed 0, at both points."""
    agent = {"shipped": [MODEL_ROOT / "routerdc"]}
    runs = {}
    for held_out in (False, True):
        out = tmp_path / f"{held_out}.json"
        main(
            True,
            1,
            str(out),
            agent,
            None,
            quality="routerdc",
            hardware="held-out" if held_out else "seed-0",
        )
        runs[held_out] = json.loads(out.read_text())
    assert "--held-out-hardware" in runs[True]["config"]["command"]
    assert "--held-out-hardware" not in runs[False]["config"]["command"]
    # the usual count given by hand is the same run, not results of their own
    same = tmp_path / "usual.json"
    main(True, 1, str(same), agent, None, quality="routerdc", hardware="held-out", n_seeds=1)
    # (the machine's entry carries the minute it ran, which two runs may straddle)
    usual = json.loads(same.read_text())["config"]
    assert {**usual, "machine": None} == {**runs[True]["config"], "machine": None}

    def qos(run: dict[str, Any]) -> dict[str, list[float]]:
        return {
            r["setting"]: r["per_seed_qos"] for r in run["results"] if r["policy"] == "least_load"
        }

    assert qos(runs[True]).keys() == qos(runs[False]).keys() == {"default", "azure trace"}
    for setting, on_seed_0 in qos(runs[False]).items():
        assert qos(runs[True])[setting] != on_seed_0, setting


@needs_data("the RouterDC data")
def test_more_environment_seeds_each_run_on_a_hardware_draw_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the first ten held-out draws, environment seed k still gets hardware of its
    own (no wrap onto an earlier draw, which would count one world twice), and none of
    it is training hardware."""
    from edgeroute.sim.edge import TRAIN_HARDWARE, default_experts

    drawn: list[int] = []

    def recorded(n: int, seed: int, **kw: Any) -> Any:
        drawn.append(seed)
        return default_experts(n, seed=seed, **kw)

    monkeypatch.setattr("edgeroute.bench.qos.default_experts", recorded)
    agent = {"shipped": [MODEL_ROOT / "routerdc"]}
    out = tmp_path / "seeds.json"
    main(True, 1, str(out), agent, None, quality="routerdc", hardware="held-out", n_seeds=12)
    run = json.loads(out.read_text())
    assert "--held-out-hardware --seeds 12 " in run["config"]["command"]
    assert [len(r["per_seed_qos"]) for r in run["results"]] == [12] * len(run["results"])
    per_point = drawn[: len(drawn) // 2]  # the default point's, then the trace's
    assert per_point == drawn[len(drawn) // 2 :]
    hardware = list(dict.fromkeys(per_point))
    assert len(hardware) == 12 and not set(hardware) & set(TRAIN_HARDWARE)


@needs_data("the RouterDC data")
def test_engine_hardware_puts_every_point_on_the_live_engines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--engine-hardware`: every point's experts are the live run's engine profiles
    (one fleet, the same for every environment seed), no hardware is drawn, and the
    results say so."""
    from edgeroute.results_io import output_dir
    from edgeroute.sim.edge import engine_experts

    built: list[int] = []

    def engines(models: tuple[str, ...], n: int) -> Any:
        built.append(n)
        return engine_experts(models, n)

    def drawn(*args: Any, **kw: Any) -> Any:
        raise AssertionError("hardware was drawn")

    monkeypatch.setattr("edgeroute.bench.qos.engine_experts", engines)
    monkeypatch.setattr("edgeroute.bench.qos.default_experts", drawn)
    agent = {"shipped": [MODEL_ROOT / "routerdc"]}
    out = tmp_path / "engines.json"
    main(True, 1, str(out), agent, None, quality="routerdc", hardware="engines", n_seeds=2)
    run = json.loads(out.read_text())
    assert "--engine-hardware --seeds 2 " in run["config"]["command"]
    assert {r["setting"] for r in run["results"]} == {"default", "azure trace"}
    # every policy, both points, both seeds: six engines each time
    assert built and set(built) == {6}
    assert len(built) == 2 * 2 * len({r["policy"] for r in run["results"]})
    notes = (output_dir(True) / "qos_routerdc_engine-hw_seeds-2_shipped.md").read_text()
    assert "Hardware is, at every point (`--engine-hardware`), the six engine profiles" in notes


@needs_data("the RouterDC data")
def test_every_point_has_the_contention_free_bound_above_every_policy(tmp_path: Path) -> None:
    """The bound is a reference row at every point: on every seed at least every
    policy's QoS, the agent's included, and never taken for the best baseline."""
    agent = {"shipped": [MODEL_ROOT / "routerdc"]}
    out = tmp_path / "bound.json"
    main(True, 1, str(out), agent, None, quality="routerdc", hardware="engines", n_seeds=2)
    run = json.loads(out.read_text())
    for setting in ("default", "azure trace"):
        here = {r["policy"]: r for r in run["results"] if r["setting"] == setting}
        assert judge(list(here.values()))["policy"] not in (BOUND, "shipped")
        bound = here.pop(BOUND)
        assert bound["reference"] and not bound["agent"]
        assert max(bound["per_seed_qos"]) > 0
        for name, row in here.items():
            for mine, ceiling in zip(row["per_seed_qos"], bound["per_seed_qos"], strict=True):
                assert mine <= ceiling, (setting, name)


@needs_data("the RouterDC data")
def test_an_agents_training_runs_on_one_environment_seed_are_one_sample(tmp_path: Path) -> None:
    """The runs of an agent on one environment seed share its world, so they are
    averaged there: the same actor given as three runs has, on two seeds, two samples
    and the interval the actor alone has (counted as six samples, its interval would be
    narrower). Seed by seed, an agent minus a copy of itself is level."""
    shipped = MODEL_ROOT / "routerdc"
    runs = {}
    for name, agents in {
        "alone": {"a": [shipped]},
        "thrice": {"a": [shipped, shipped, shipped], "copy": [shipped]},
    }.items():
        out = tmp_path / f"{name}.json"
        main(True, 1, str(out), agents, None, quality="routerdc", n_seeds=2)
        runs[name] = {
            (r["setting"], r["policy"]): r for r in json.loads(out.read_text())["results"]
        }
    alone, thrice = runs["alone"][("default", "a")], runs["thrice"][("default", "a (3 seeds)")]
    assert len(thrice["per_seed_qos"]) == 2
    assert [len(r) for r in thrice["per_run_qos"]] == [2, 2, 2]
    assert thrice["per_seed_qos"] == pytest.approx(alone["per_seed_qos"])
    assert thrice["qos_ci"] == alone["qos_ci"]
    assert thrice["paired_minus_agents"].startswith("copy: ")
    assert thrice["paired_minus_agents"].endswith(" of 2)")
    # Three equal runs do not spread: counting them changes nothing.
    assert thrice["qos_ci_runs"] == thrice["qos_ci"]
    name, shown = thrice["paired_minus_agents_runs"].split(": ")
    assert name == "copy"
    assert all(abs(float(x)) < 1e-12 for x in shown.split(" ± "))  # 0 but for rounding


def row(policy: str, per_run: list[list[float]], agent: bool = True) -> dict[str, Any]:
    """A `bench qos` result row as `main` writes it, from its per-run figures."""
    per_seed = [statistics.fmean(c) for c in zip(*per_run, strict=True)]
    return {
        "policy": policy,
        "agent": agent,
        "reference": False,
        "qos": statistics.fmean(per_seed),
        "qos_ci": shown(per_seed),
        "per_seed_qos": per_seed,
        "per_run_qos": per_run,
    }


def test_an_agent_whose_runs_disagree_wins_over_the_seeds_but_not_counting_the_runs() -> None:
    """Four runs, two far ahead and two near the rival: averaged on each seed the agent
    is apart above it; counting its runs as samples of training it is not."""
    seeds = [0.40, 0.41, 0.39, 0.40, 0.42, 0.38]
    lucky, plain = [x + 0.06 for x in seeds], [x + 0.01 for x in seeds]
    here = [
        row("SQF", [[x - 0.2 for x in seeds]], agent=False),
        row("full (4 seeds)", [lucky, plain, lucky, plain]),
        row("dsa (2 seeds)", [seeds, [x + 0.002 for x in seeds]]),
    ]
    best = judge(here)
    full, dsa = here[1], here[2]
    assert best["policy"] == "SQF"
    assert full["against_best"] == full["against_best_runs"] == "wins"
    assert full["against_agents"] == "wins (dsa (2 seeds))"
    assert full["against_agents_runs"] == "tie (dsa (2 seeds))"
    assert full["paired_minus_agents"].startswith("dsa (2 seeds): 0.034 ± ")
    assert full["paired_minus_agents_runs"].startswith("dsa (2 seeds): 0.034 ± ")
    assert full["qos_ci_runs"] != full["qos_ci"]
    assert "against_agents" not in dsa


@needs_data("the RouterDC data")
def test_a_trace_too_short_for_every_seed_gives_its_point_the_seeds_it_holds(
    tmp_path: Path,
) -> None:
    """Any file of the Azure format is taken: one holding two episodes (of a quick
    run's 256 decisions, each seed reading 258 requests from its 256 * k-th) gives the
    trace point two of the three seeds, and its label says so; every other point keeps
    all three. One holding less than an episode is refused before anything runs."""
    out = tmp_path / "short.json"
    trace = write_trace(tmp_path / "trace.csv", 2 * 256 + 2)
    agent = {"shipped": [MODEL_ROOT / "routerdc"]}
    main(True, 1, str(out), agent, str(trace), quality="routerdc", n_seeds=3)
    seeds = {r["setting"]: len(r["per_seed_qos"]) for r in json.loads(out.read_text())["results"]}
    assert seeds == {"default": 3, "azure trace (2 of the 3 seeds: the trace's windows of 256)": 2}
    with pytest.raises(SystemExit, match="fewer than 258 requests"):
        main(True, 1, str(out), agent, str(write_trace(trace, 257)), quality="routerdc")


@needs_data("the RouterDC data")
def test_a_mooncake_trace_is_a_trace_point_and_a_result_of_its_own(tmp_path: Path) -> None:
    """Any file with arrival instants and token counts is taken, Mooncake's format as
    well as Azure's: its point is labelled by its format, and a given trace names the
    results and stands in their command, so it never overwrites the default trace's."""
    out = tmp_path / "mooncake.json"
    trace = synthetic_mooncake(
        tmp_path / "mc.jsonl", requests=256 + 2, inputs=(100, 3000), outputs=(10, 300)
    )
    main(True, 1, str(out), {"shipped": [MODEL_ROOT / "routerdc"]}, str(trace), "routerdc")
    got = json.loads(out.read_text())
    assert {r["setting"] for r in got["results"]} == {"default", "mooncake trace"}
    assert f" --trace {trace}" in got["config"]["command"]
    assert "_trace-mc_" in got["benchmark"]
    on_trace = [r for r in got["results"] if r["setting"] == "mooncake trace"]
    assert {r["policy"] for r in on_trace} >= {"RR", "SQF", "shipped"}
    assert trace_named("qos_routerdc", trace) == ("qos_routerdc_trace-mc", f" --trace {trace}")
    assert trace_named("qos_routerdc", None) == ("qos_routerdc", "")


def test_a_trace_without_instants_or_token_counts_is_refused(tmp_path: Path) -> None:
    """Refusals the command line prints as one line (`edgeroute.cli`): a missing file
    (with the data folder's hint when it is there) stays a FileNotFoundError."""
    prompts = tmp_path / "prompts.csv"
    prompts.write_text('"","sample_id","prompt","eval_name"\n"1","m.1","Add two numbers.","mbpp"\n')
    with pytest.raises(ValueError, match="prompt set, without arrival instants"):
        timed_trace(prompts)
    unknown = tmp_path / "notes.txt"
    unknown.write_text("hello\n")
    with pytest.raises(ValueError, match="neither a Mooncake JSONL"):
        timed_trace(unknown)
    with pytest.raises(FileNotFoundError):
        timed_trace(tmp_path / "absent.csv")
    assert timed_trace(write_trace(tmp_path / "a.csv", 3))[0] == "azure trace"


@needs_data("the RouterDC data")
def test_the_committed_engines_sweep_is_what_this_code_gives_on_its_first_seed() -> None:
    """Committed results come from the code that is here: (65)'s sweep on the live
    engines, replayed at its default point on its first environment seed, gives each
    policy's committed QoS exactly (the simulator is deterministic). A change to the
    simulator, the features or the serving policy that moves a committed figure fails
    here, until the results are run again."""
    from edgeroute.qos.config import DEFAULT_LATENCY_MS, best_predicted
    from edgeroute.qos.evaluate import BASELINES, evaluate, served
    from edgeroute.results_io import output_dir
    from edgeroute.sim.workload import read_azure
    from policies import PipelineSpec, build_pipeline
    from policies.qos_drl import load

    name = "qos_routerdc_scrape-1000ms_engine-hw_seed-1001_seeds-60_last5-full_last5-dsa_last5-baseline"
    committed = json.loads((output_dir(False) / f"{name}.json").read_text())
    first_seed = committed["config"]["seeds"][0]
    first_run = Path(committed["config"]["models"]["last5-full"][0])
    rows = {r["policy"]: r for r in committed["results"] if r["setting"] == "default"}
    sweep = routerdc_sweep(
        trace=read_azure(DATA_DIR / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv.gz"),
        hardware="engines",
        scrape_ms=1000,
    )
    policies = {
        "RR": BASELINES["RR"],
        "SQF": BASELINES["SQF"],
        "least_load": served(build_pipeline(PipelineSpec(policy="least_load"))),
        "BR": served(build_pipeline(PipelineSpec(**best_predicted("routerdc")))),
        "last5-full (5 seeds)": served(load(first_run, DEFAULT_LATENCY_MS)),
    }
    got = {n: evaluate(sweep.env(0), p, [first_seed]).qos for n, p in policies.items()}
    assert got == {n: rows[n]["per_run_qos"][0][0] for n in policies}
    # and the trace point, which reads the first window of the Azure trace
    (trace_row,) = (
        r
        for r in committed["results"]
        if r["setting"].startswith("azure trace") and r["policy"] == "least_load"
    )
    on_trace = evaluate(sweep.env(0, arrivals=True), policies["least_load"], [first_seed])
    assert on_trace.qos == trace_row["per_run_qos"][0][0]


@needs_data("the RouterDC data")
def test_a_time_scale_lengthens_every_experts_time_constants_wherever_they_are() -> None:
    """`--time-scale 1.02`: on every kind of hardware each expert's base, per-prefill-
    token and per-context-token times are 2% longer and nothing else of it changes, so
    the same policy on the same seed answers more slowly."""
    from dataclasses import replace

    from edgeroute.qos.evaluate import evaluate, served
    from policies import PipelineSpec, build_pipeline

    sweep = routerdc_sweep()
    slow = replace(sweep, physics=Physics(1.02))
    for on in ("seed-0", "held-out", "engines"):
        before, after = sweep.env(3, on=on).specs, slow.env(3, on=on).specs
        assert after == [
            replace(e, base=e.base * 1.02, k1=e.k1 * 1.02, k2=e.k2 * 1.02) for e in before
        ]
        assert all(a.base > b.base and a.k1 > b.k1 for a, b in zip(after, before, strict=True))
    least_load = served(build_pipeline(PipelineSpec(policy="least_load")))
    took = [evaluate(s.env(0), least_load, [101]).latency_ms for s in (sweep, slow)]
    assert took[1] > took[0]


@needs_data("the quality data")
def test_an_agent_with_another_worlds_predictor_is_refused(tmp_path: Path) -> None:
    """An actor lying outside its world's folder would fall back to the predictor the
    gateway serves by default (RouterDC's) and predict for models the RouterBench world
    does not have."""
    lone = tmp_path / "lone"
    lone.mkdir()
    shutil.copy(MODEL_ROOT / "actor.onnx", lone / "actor.onnx")
    with pytest.raises(SystemExit, match="not the routerbench world's"):
        main(True, 1, None, {"lone": [lone]}, None, quality="routerbench")


def _children() -> set[int]:
    """This process's child processes, over all its threads. A thread that ends while
    they are read hands its children to another, perhaps one already read, so the
    reading starts over until it sees every thread it listed."""
    me = os.getpid()
    while True:
        found: set[int] = set()
        try:
            for task in Path(f"/proc/{me}/task").iterdir():
                found.update(int(p) for p in (task / "children").read_text().split())
        except FileNotFoundError:
            continue
        return found


@needs_data("the RouterDC data")
def test_live_qos_answers_or_sheds_every_request_through_a_gateway_process() -> None:
    """The gateway runs apart from the emulated engines (a policy's decisions must not
    stall them), every request is answered or shed, and the gateway does not outlive
    the run."""
    from edgeroute.bench.live import gateway_clock
    from edgeroute.bench.qos_live import run_policy
    from edgeroute.sim.edge import load_tasks
    from policies import qos_drl

    prompts = [t.prompt for t in load_tasks(DATA_DIR, split="eval", quality="routerdc")[:24]]
    model = str(MODEL_ROOT / "routerdc")
    spec = gateway_clock({"policy": "qos_drl", "model": model}, 0.030, 10.0)

    def loads() -> int:  # policies built in this process
        info = qos_drl._loaded.cache_info()
        return info.hits + info.misses

    before, built = _children(), loads()
    r = asyncio.run(run_policy(spec, prompts, [0.2] * 24, 10.0, 0.030, DATA_DIR, "routerdc"))
    assert loads() == built  # the policy was built and served elsewhere
    assert r["requests"] == 24
    assert 0.0 <= r["drop_rate"] < 1.0 and r["latency_ms"] > 0
    assert 0.0 <= r["qos"] <= r["met_share"] <= 1.0 - r["drop_rate"]
    # every answer names its engine, and the engines' loop was watched throughout
    assert 1 / 6 <= r["busiest_share"] <= 1.0 and r["loop_lag_ms"] >= 0.0
    # the shares per engine are of the answered requests, the busiest among them
    shares = r["engine_shares"]
    assert sum(shares.values()) == pytest.approx(1.0)
    assert max(shares.values()) == r["busiest_share"]
    # the answers' own score, latency aside: at least what QoS counts of them
    answered = 1.0 - r["drop_rate"]
    assert r["qos"] <= r["answered_score"] * answered + 1e-12 and r["answered_score"] <= 1.0
    assert r["send_late_ms"] >= 0.0  # and how late the client sent, too
    assert _children() <= before


@needs_data("the RouterDC data")
def test_a_live_run_with_more_engines_serves_from_every_one_of_them() -> None:
    """Eight engines, cycling the six profiles: round-robin spreads 24 requests over
    all eight (each backend its own id), not over the six profiles' worth."""
    from edgeroute.bench.qos_live import run_policy
    from edgeroute.sim.edge import load_tasks

    prompts = [t.prompt for t in load_tasks(DATA_DIR, split="eval", quality="routerdc")[:24]]
    spec = {"policy": "round_robin"}
    r = asyncio.run(
        run_policy(spec, prompts, [0.2] * 24, 10.0, 0.030, DATA_DIR, "routerdc", engines=8)
    )
    assert r["requests"] == 24 and r["drop_rate"] == 0.0 and r["errors"] == 0
    assert r["busiest_share"] == pytest.approx(1 / 8)
    assert len(r["engine_shares"]) == 8
    assert all(v == pytest.approx(1 / 8) for v in r["engine_shares"].values())


@needs_data("the RouterDC data")
def test_a_live_run_counts_the_prefill_its_engines_prefix_caches_skipped() -> None:
    """Round-robin over six engines: the same prompt 24 times comes to each engine four
    times, and each engine computes its prefill once; 24 different prompts skip far
    less. The share is the live twin of the replay's simulated `prefill_skipped`."""
    from edgeroute.bench.qos_live import run_policy
    from edgeroute.sim.edge import load_tasks

    tasks = load_tasks(DATA_DIR, split="eval", quality="routerdc")
    longest = max(tasks, key=lambda t: t.prompt_tokens)
    assert longest.prompt_tokens > 64  # several of the cache's 16-token blocks

    def skipped(prompts: list[str]) -> float:
        r = asyncio.run(
            run_policy(
                {"policy": "round_robin"}, prompts, [0.2] * 24, 10.0, 0.030, DATA_DIR, "routerdc"
            )
        )
        assert r["requests"] == 24 and r["errors"] == 0
        share: float = r["prefill_skipped"]
        return share

    repeated = skipped([longest.prompt] * 24)
    different = skipped([t.prompt for t in tasks[:24]])
    # three of each engine's four prompts skip every full 16-token block of theirs
    assert repeated == pytest.approx(
        3 / 4 * (longest.prompt_tokens // 16 * 16) / longest.prompt_tokens, abs=0.02
    )
    assert 0.0 <= different < 0.05


@needs_data("the RouterDC data")
def test_a_live_run_whose_gateway_port_is_taken_starts_it_on_another(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The port found free for the gateway is taken before it binds (in a run of
    thousands of connections, an outgoing one can take it): the run goes on, on
    another port, and says so."""
    import socket

    from edgeroute.bench import qos_live
    from edgeroute.sim.edge import load_tasks
    from gateway.ports import free_ports as free

    prompts = [t.prompt for t in load_tasks(DATA_DIR, split="eval", quality="routerdc")[:6]]
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    first = True

    def ports(count: int) -> list[int]:
        nonlocal first
        found = free(count)
        if first:
            first = False
            found[0] = taken.getsockname()[1]  # the gateway's
        return found

    monkeypatch.setattr(qos_live, "free_ports", ports)
    with taken:
        r = asyncio.run(
            qos_live.run_policy(
                {"policy": "round_robin"}, prompts, [0.2] * 6, 10.0, 0.030, DATA_DIR, "routerdc"
            )
        )
    assert r["requests"] == 6 and r["errors"] == 0 and r["drop_rate"] == 0.0
    said = capsys.readouterr().out
    assert "the gateway did not start" in said and "address already in use" in said.lower()


@needs_data("the RouterDC data")
def test_a_live_run_whose_gateway_never_starts_stops_its_engines_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The hostile twin of a start-up retried: every start of the gateway fails. The
    run ends with the gateway's error, and the engines it started no longer listen."""
    import socket

    from edgeroute.bench import qos_live
    from edgeroute.bench.overhead import ServerExited
    from gateway.ports import free_ports as free
    from workers.profiles import EXPERTS

    handed: list[int] = []

    def ports(count: int) -> list[int]:
        found = free(count)
        handed.extend(found)
        return found

    def never(*_: object, **__: object) -> None:
        raise ServerExited("the gateway exited at start-up: Address already in use")

    monkeypatch.setattr(qos_live, "free_ports", ports)
    monkeypatch.setattr(qos_live, "start_gateway", never)

    async def run() -> list[int]:
        with pytest.raises(ServerExited):
            await qos_live.run_policy(
                {"policy": "round_robin"}, ["a"], [0.0], 10.0, 0.030, DATA_DIR, "routerdc"
            )
        listening = []  # asked while the loop that served the engines still runs
        for port in handed[1 : 1 + len(EXPERTS)]:  # drawn with the gateway's, after it
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    listening.append(port)
        return listening

    assert asyncio.run(run()) == []


def test_a_live_run_at_another_scrape_writes_results_of_its_own() -> None:
    from edgeroute.bench.qos_live import SCRAPE_MS, named

    assert named("routerdc", SCRAPE_MS, {}) == ("qos_live_routerdc", "")
    assert named("routerbench", SCRAPE_MS, {}) == ("qos_live", "")
    assert named("routerdc", 200.0, {}) == ("qos_live_routerdc_scrape-200ms", " --scrape-ms 200")
    name, flags = named("routerdc", 200.0, {"x": [Path("a")]})
    assert (name, flags) == ("qos_live_routerdc_scrape-200ms_x", " --scrape-ms 200 --model x=a")
    name, flags = named("routerdc", SCRAPE_MS, {"x": [Path("a")]}, max_batch=5)
    assert (name, flags) == ("qos_live_routerdc_batch-5_x", " --max-batch 5 --model x=a")
    name, flags = named("routerdc", SCRAPE_MS, {}, rate=8.0)
    assert (name, flags) == ("qos_live_routerdc_rate-8", " --rate 8")
    name, flags = named("routerdc", SCRAPE_MS, {}, rate=8.0, first_seed=101)
    assert (name, flags) == ("qos_live_routerdc_rate-8_seed-101", " --rate 8 --seed 101")
    name, flags = named("routerdc", SCRAPE_MS, {}, first_seed=801, latency_ms=40.0)
    assert (name, flags) == ("qos_live_routerdc_L-40ms_seed-801", " --latency-ms 40 --seed 801")
    assert named("routerdc", SCRAPE_MS, {}, latency_ms=30.0) == ("qos_live_routerdc", "")
    name, flags = named("routerdc", SCRAPE_MS, {}, first_seed=901, engines=12)
    assert (name, flags) == ("qos_live_routerdc_engines-12_seed-901", " --engines 12 --seed 901")
    assert named("routerdc", SCRAPE_MS, {}, engines=6) == ("qos_live_routerdc", "")
    name, flags = named("routerdc", SCRAPE_MS, {}, engines=12, speedup=5.0)
    assert (name, flags) == ("qos_live_routerdc_engines-12_x5", " --engines 12 --speedup 5")
    assert named("routerdc", SCRAPE_MS, {}, speedup=10.0) == ("qos_live_routerdc", "")


def test_a_live_run_with_more_engines_says_they_cycle_the_models() -> None:
    from edgeroute.bench.qos_live import fleet_words

    assert "first six of RouterDC's models" in fleet_words("routerdc", 6)
    twelve = fleet_words("routerdc", 12)
    assert twelve.startswith("12 emulated workers") and "first six" not in twelve
    assert "7 models, each cycled" in twelve


def test_a_live_run_records_which_model_each_engine_answers_as() -> None:
    """Backend ids name the hardware profile; at twelve engines the six profiles and
    RouterDC's seven models cycle apart, so the id alone does not say the model."""
    from edgeroute.bench.qos_live import engine_models
    from edgeroute.sim.edge import QUALITY_MODELS
    from workers.profiles import EXPERTS

    models = QUALITY_MODELS["routerdc"]
    twelve = engine_models("routerdc", 12)
    assert len(twelve) == 12
    assert twelve[EXPERTS[0]] == models[0]
    assert twelve[f"{EXPERTS[0]}-2"] == models[6]  # the seventh engine: profile 1, model 7
    assert twelve[f"{EXPERTS[2]}-2"] == models[1]


def test_a_live_request_whose_connection_fails_is_an_error_not_a_crash() -> None:
    """The hostile twin of the live harness: a server that closes every connection
    without answering. Each request is kept, scored 0 and counted as failed."""
    from edgeroute.bench.qos_live import FAILED, replay

    async def run() -> list[tuple[float, float, int, str]]:
        async def hang_up(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.close()

        server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await replay(port, ["a", "b", "c"], [0.0, 0.0, 0.0], 1.0, late)

    late: list[float] = []
    results = asyncio.run(run())
    assert len(late) == 3  # each send's lateness, kept
    assert [r[2] for r in results] == [FAILED] * 3
    assert all(r[0] == 0.0 for r in results)


def test_a_live_summary_pairs_each_policy_by_seed_with_least_load_and_the_agents() -> None:
    """Seed by seed, on the same requests: the first agent is above the second on both
    seeds and above least-load on one; least-load has no difference of its own."""
    from edgeroute.bench.qos_live import summarise

    def run(seed: int, policy: str, qos: float) -> dict[str, Any]:
        figures = {"met_share": qos, "drop_rate": 0.0, "latency_ms": 20.0, "requests": 10}
        return {
            "seed": seed,
            "policy": policy,
            "qos": qos,
            "errors": 0,
            **figures,
            "busiest_share": 0.5,
            "loop_lag_ms": 1.0,
        }

    rows = [
        run(1, "least_load", 0.2),
        run(2, "least_load", 0.3),
        run(3, "least_load", 0.3),
        {**run(1, "full", 0.4), "run": 0, "answered_score": 0.5, "engine_shares": {"a": 1.0}},
        {**run(2, "full", 0.25), "run": 1, "answered_score": 0.6, "engine_shares": {"b": 1.0}},
        {**run(3, "full", 0.3), "run": 0, "answered_score": 0.7, "engine_shares": {"a": 1.0}},
        {**run(1, "dsa", 0.1), "run": 0},
        {**run(2, "dsa", 0.2), "run": 0},
        {**run(3, "dsa", 0.2), "run": 0},
    ]
    summary = {r["policy"]: r for r in summarise(rows, ["full", "dsa"])}
    assert summary["least_load"]["minus_least_load"] == ""
    assert summary["full"]["minus_least_load"].endswith("(above on 1 of 3)")
    # differences 0.3, 0.05, 0.1: mean 0.15, sd 0.132, t(2) 4.30 over sqrt(3)
    assert summary["full"]["paired_minus_agents"] == "dsa: 0.15 ± 0.33 (above on 3 of 3)"
    assert "paired_minus_agents" not in summary["dsa"]
    assert summary["full"]["per_seed_qos"] == [0.4, 0.25, 0.3]
    # each training run read on the seeds it served
    assert summary["full"]["per_seed_run"] == [0, 1, 0]
    assert summary["full"]["by_run_qos"] == "0.350, 0.250"
    assert summary["dsa"]["by_run_qos"] == "0.167"
    assert summary["least_load"]["by_run_qos"] == ""
    assert summary["least_load"]["per_seed_run"] == [None, None, None]
    # the answers' score and the engines that gave them, where a run recorded them
    assert summary["full"]["answered_score"] == "0.600"
    assert summary["full"]["per_seed_engine_shares"][1] == {"b": 1.0}
    assert summary["dsa"]["answered_score"] == ""


def test_an_episode_pauses_the_collector_and_collects_its_cycles_after() -> None:
    import gc
    import weakref

    from edgeroute.bench.qos_live import collector_paused

    class Node:
        peer: object

    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        node = Node()
        node.peer = node  # a cycle: only the collector frees it
        alive = weakref.ref(node)
        del node
        assert alive() is not None
    assert alive() is None and gc.isenabled()
    # an episode that fails still gives the collector back
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("the episode failed")
    assert gc.isenabled()


@needs_data("the RouterDC data")
def test_with_the_prefix_cache_a_concentrating_policy_skips_prefill_and_answers_sooner() -> None:
    """`--prefix-cache`: the experts keep the worker's prefix cache. The evaluation
    prompts come back within an episode, so a policy that sends them to few experts
    (BR: the best predicted) finds more of them cached than one that spreads them
    (RR), and answers sooner than in the cacheless world; without the option nothing
    is skipped."""
    from dataclasses import replace

    from edgeroute.qos.config import best_predicted
    from edgeroute.qos.evaluate import BASELINES, evaluate, served
    from policies import PipelineSpec, build_pipeline

    sweep = routerdc_sweep(hardware="engines")
    cached = replace(sweep, physics=Physics(prefix_cache=True))
    br = served(build_pipeline(PipelineSpec(**best_predicted("routerdc"))))

    def skipped_share(env: EdgeEnv) -> float:
        return sum(e.skipped_total for e in env.experts) / sum(e.prompt_total for e in env.experts)

    shares, took = {}, {}
    for name, policy in (("RR", BASELINES["RR"]), ("BR", br)):
        plain, env = sweep.env(0), cached.env(0)
        took[name] = (
            evaluate(plain, policy, [101]).latency_ms,
            evaluate(env, policy, [101]).latency_ms,
        )
        assert skipped_share(plain) == 0
        shares[name] = skipped_share(env)
    assert 0 < shares["RR"] < shares["BR"]
    assert took["BR"][1] < took["BR"][0]


def test_results_of_agents_served_otherwise_are_not_overwritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Results are named by their agents, not by how they are served: a run whose file
    would replace one of the same agents served otherwise is refused, by name; the same
    serving, a new name, a quick run or a file it cannot read go on."""
    from edgeroute.bench import qos

    monkeypatch.setattr(qos, "output_dir", lambda quick: tmp_path)
    (tmp_path / "qos_live_a.json").write_text(
        json.dumps({"config": {"command": "edgeroute bench qos --live --model a=x --sample a"}})
    )
    with pytest.raises(SystemExit, match=r"qos_live_a\.json holds these agents served otherwise"):
        qos.refuse_other_serving("qos_live_a", {}, quick=False)
    qos.refuse_other_serving("qos_live_a", {"a": {"sample": True}}, quick=False)
    qos.refuse_other_serving("qos_live_a", {}, quick=True)
    qos.refuse_other_serving("qos_live_b", {}, quick=False)
    (tmp_path / "qos_live_c.json").write_text("{not json")
    qos.refuse_other_serving("qos_live_c", {}, quick=False)


def test_a_live_run_drawing_the_agents_of_committed_argmax_results_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(90)'s agents by argmax are committed under their names; the same command with
    `--sample` would overwrite them, and is refused before anything runs."""
    from edgeroute.bench import qos_live
    from edgeroute.cli import build_parser

    def ran(*_: object) -> None:
        raise AssertionError("the run started")

    monkeypatch.setattr(qos_live, "main", ran)
    argv = (
        "bench qos --live --seeds 10 --quality routerdc --engines 12 --seed 3451"
        " --model last5-full=a --model last5-dsa=b --model last5-baseline=c --sample last5-full"
    )
    args = build_parser().parse_args(argv.split())
    with pytest.raises(SystemExit, match="served otherwise"):
        args.func(args)


def test_a_run_reads_one_predictor_and_refuses_agents_trained_with_another(
    tmp_path: Path,
) -> None:
    """`--predictor`: every policy of the run reads the predictor in that folder, its
    results are named after it, and an agent is measured only with the predictor it
    trained with (the nearest above its folder)."""
    from edgeroute.bench.qos import predictor_named, run_predictor
    from edgeroute.bench.qos_live import plan
    from edgeroute.qos.predictors import reread_predictor

    world = (MODEL_ROOT / "routerdc").resolve()
    other = tmp_path / "expected-read"
    other.mkdir()
    reread_predictor(world, other, "expected")
    own = other / "full-s0"
    own.mkdir()
    shutil.copy(world / "engines" / "actor.onnx", own / "actor.onnx")
    assert run_predictor("routerdc", other, {"full": [own]}) == other.resolve()
    assert run_predictor("routerdc", None, {"k1": [world / "engines"]}) == world
    with pytest.raises(SystemExit, match="is not " + str(other.resolve())):
        run_predictor("routerdc", other, {"k1": [world / "engines"]})
    with pytest.raises(SystemExit, match="not the routerdc world's"):
        run_predictor("routerdc", None, {"full": [own]})
    with pytest.raises(SystemExit, match="not of the routerbench world's models"):
        run_predictor("routerbench", other, {})
    assert predictor_named("qos_routerdc", "routerdc", world) == ("qos_routerdc", "")
    name, flag = predictor_named("qos_routerdc", "routerdc", other.resolve())
    assert name == "qos_routerdc_predictor-expected-read" and flag.endswith(str(other.resolve()))

    live = plan(True, 1, {"full": [own]}, quality="routerdc", predictor=other)
    assert "_predictor-expected-read_" in live.name
    assert live.config["predictor"] == str(other.resolve())
    assert " --predictor " in live.config["command"]
    with pytest.raises(SystemExit, match="is not " + str(other.resolve())):
        plan(True, 1, {"k1": [world / "engines"]}, quality="routerdc", predictor=other)
    plain = plan(True, 1, {"k1": [world / "engines"]}, quality="routerdc")
    assert "predictor" not in plain.config and "predictor" not in plain.name
