"""Paired differences from a QoS run's results file: the committed run gives the table
docs/research.md took by hand, and names or pairs the run cannot give are refused."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from edgeroute.bench.qos_paired import LIVE, NotPaired, default_pairs, paired_rows
from edgeroute.results_io import RESULTS
from tests.support import edgeroute

# (41) of docs/research.md: the engines' fleet, 30 seeds.
SWEEP = "qos_routerdc_scrape-1000ms_engine-hw_seeds-30_rel-sh-full_rel-full_rel-dsa"
# (104): the engines' fleet, 60 seeds, five training runs per agent.
PRIOR_SWEEP = (
    "qos_routerdc_scrape-1000ms_engine-hw_seed-1001_seeds-60_tp5-full_tp5-dsa_tp5-baseline"
    "_last5-full-sp_last5-dsa-sp_last5-baseline-sp_last5-full"
)
# (39): live at L = 25 ms, 20 seeds.
LIVE_RUN = "qos_live_routerdc_L-25ms_seed-2801_rel-full_rel-dsa_ep-baseline"


def load(name: str) -> dict[str, Any]:
    payload: dict[str, Any] = json.loads((RESULTS / f"{name}.json").read_text())
    return payload


def by_setting(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["setting"]: r for r in rows}


def test_the_committed_sweep_gives_the_table_taken_by_hand() -> None:
    rows = by_setting(
        paired_rows(load(SWEEP), [("rel-sh-full", "rel-dsa"), ("rel-full", "rel-dsa")])
    )
    # research.md, "What (40) and (41) showed"
    assert rows["L=25ms"]["rel-sh-full - rel-dsa"] == "+0.033 ± 0.008 (27 of 30) above"
    assert rows["L=25ms"]["rel-full - rel-dsa"] == "+0.050 ± 0.008 (30 of 30) above"
    assert rows["N=12"]["rel-full - rel-dsa"] == "-0.056 ± 0.026 (5 of 30) below"
    assert rows["lambda=6"]["rel-full - rel-dsa"] == "-0.005 ± 0.006 (13 of 30) tie"


def test_by_default_the_first_agent_is_set_against_each_other() -> None:
    payload = load(SWEEP)
    assert default_pairs(payload) == [("rel-sh-full", "rel-full"), ("rel-sh-full", "rel-dsa")]


def test_a_pair_is_antisymmetric_and_a_policy_against_itself_is_a_tie() -> None:
    payload = load(SWEEP)
    forth = by_setting(paired_rows(payload, [("rel-full", "SQF")]))
    back = by_setting(paired_rows(payload, [("SQF", "rel-full")]))
    same = by_setting(paired_rows(payload, [("rel-full", "rel-full")]))
    for setting, row in forth.items():
        mean = float(row["rel-full - SQF"].split()[0])
        assert float(back[setting]["SQF - rel-full"].split()[0]) == pytest.approx(-mean, abs=1e-3)
        assert same[setting]["rel-full - rel-full"] == "+0.000 ± 0.000 (0 of 30) tie"


def test_a_live_run_is_one_setting() -> None:
    rows = paired_rows(load(LIVE_RUN), [("rel-full", "rel-dsa")])
    assert [r["setting"] for r in rows] == [LIVE]
    # research.md, (39): paired over rel-dsa +0.058 ± 0.008, 20 of 20 (the run's own
    # column, 0.0575 to three figures; 0.05749... here, to three decimals)
    assert rows[0]["rel-full - rel-dsa"] == "+0.057 ± 0.008 (20 of 20) above"


def test_counting_the_training_runs_the_seeds_verdicts_become_ties() -> None:
    """Five runs per agent: over the 60 seeds alone the full agent is paired above dsa at
    L = 25 ms and below it at lambda = 3; counting the runs, the intervals hold 0."""
    payload = load(PRIOR_SWEEP)
    seeds = by_setting(paired_rows(payload, [("tp5-full", "tp5-dsa")]))
    runs = by_setting(paired_rows(payload, [("tp5-full", "tp5-dsa")], runs=True))
    assert seeds["L=25ms"]["tp5-full - tp5-dsa"] == "+0.016 ± 0.003 (56 of 60) above"
    assert seeds["lambda=3"]["tp5-full - tp5-dsa"] == "-0.018 ± 0.003 (5 of 60) below"
    assert runs["L=25ms"]["tp5-full - tp5-dsa"] == "+0.016 ± 0.026 tie"
    assert runs["lambda=3"]["tp5-full - tp5-dsa"] == "-0.018 ± 0.046 tie"
    # A heuristic is one run: against it only the agent's runs and the seeds count.
    against = by_setting(paired_rows(payload, [("tp5-full", "SQF")], runs=True))
    assert against["default"]["tp5-full - SQF"].endswith(" above")


def test_a_live_run_cannot_count_its_training_runs() -> None:
    with pytest.raises(NotPaired, match="has no per_run_qos: only a simulated"):
        paired_rows(load(LIVE_RUN), [("rel-full", "rel-dsa")], runs=True)


def test_a_name_the_run_lacks_is_refused_with_the_names_it_has() -> None:
    with pytest.raises(NotPaired, match=r"no policy 'rel-ful' at default; the run has .*rel-full"):
        paired_rows(load(SWEEP), [("rel-ful", "rel-dsa")])


def test_policies_of_unequal_seeds_are_refused() -> None:
    payload = load(SWEEP)
    for row in payload["results"]:
        if row["policy"] == "SQF":
            row["per_seed_qos"] = row["per_seed_qos"][:-1]
    with pytest.raises(NotPaired, match="different seeds"):
        paired_rows(payload, [("rel-full", "SQF")])


def test_a_run_of_one_agent_needs_named_pairs() -> None:
    payload = load(SWEEP)
    payload["config"]["models"] = {"rel-full": payload["config"]["models"]["rel-full"]}
    with pytest.raises(NotPaired, match="name them with --pair"):
        paired_rows(payload, default_pairs(payload))


def command(*args: str) -> subprocess.CompletedProcess[str]:
    return edgeroute("bench", "qos-paired", *args)


def test_the_command_prints_the_table_and_writes_it(tmp_path: Path) -> None:
    out = tmp_path / "paired.json"
    done = command(str(RESULTS / f"{SWEEP}.json"), "--pair", "rel-full,rel-dsa", "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert "| L=25ms | +0.050 ± 0.008 (30 of 30) above |" in done.stdout
    written = json.loads(out.read_text())
    assert written["pairs"] == [["rel-full", "rel-dsa"]]
    assert len(written["rows"]) == len({r["setting"] for r in load(SWEEP)["results"]})


def test_the_command_counts_the_training_runs_when_asked(tmp_path: Path) -> None:
    out = tmp_path / "paired.json"
    run = str(RESULTS / f"{PRIOR_SWEEP}.json")
    done = command(run, "--pair", "tp5-full,tp5-dsa", "--runs", "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert "counting the training runs" in done.stdout
    assert "| L=25ms | +0.016 ± 0.026 tie |" in done.stdout
    assert json.loads(out.read_text())["runs"] is True
    live = command(str(RESULTS / f"{LIVE_RUN}.json"), "--pair", "rel-full,rel-dsa", "--runs")
    assert live.returncode != 0
    assert "has no per_run_qos: only a simulated `bench qos` run" in live.stderr


@pytest.mark.parametrize("pair", ["rel-full", "rel-full,", "a,b,c"])
def test_the_command_refuses_a_pair_that_is_not_two_names(pair: str) -> None:
    done = command(str(RESULTS / f"{SWEEP}.json"), "--pair", pair)
    assert done.returncode == 2
    assert "a pair is two names, A,B" in done.stderr


def test_the_command_refuses_an_unknown_name_with_a_message(tmp_path: Path) -> None:
    out = tmp_path / "paired.json"
    done = command(str(RESULTS / f"{SWEEP}.json"), "--pair", "nobody,rel-dsa", "--json", str(out))
    assert done.returncode != 0
    assert "edgeroute bench qos-paired: no policy 'nobody'" in done.stderr
    assert not out.exists()
