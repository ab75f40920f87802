"""`bench qos-join`: two runs of one world on the same seeds, as the run of all their
agents."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from edgeroute.bench.qos import main
from edgeroute.bench.qos_join import NotJoinable, joined
from policies.predictor import MODEL_ROOT
from tests.support import edgeroute, needs_data


def run(tmp_path: Path, name: str, agents: list[str], seed: int = 1) -> dict[str, Any]:
    """A quick `bench qos` run (the default point and the trace, one seed) of the
    shipped RouterDC actor under each of `agents`' names."""
    out = tmp_path / f"{name}.json"
    models = {a: [MODEL_ROOT / "routerdc"] for a in agents}
    main(True, seed, str(out), models, None, quality="routerdc", n_seeds=1)
    data: dict[str, Any] = json.loads(out.read_text())
    return data


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("join")
    return {
        "a": run(tmp, "a", ["a"]),
        "b": run(tmp, "b", ["b", "c"]),
        "abc": run(tmp, "abc", ["a", "b", "c"]),
        "b_seed_2": run(tmp, "b2", ["b"], seed=2),
    }


def without_machine(run: dict[str, Any]) -> dict[str, Any]:
    return {**run, "config": {k: v for k, v in run["config"].items() if k != "machine"}}


@needs_data("the RouterDC data")
def test_two_runs_joined_are_the_run_of_all_their_agents(
    runs: dict[str, dict[str, Any]],
) -> None:
    """Name, command, models and every row, verdicts included, as one run of all three
    agents gives them."""
    both = joined(runs["a"], runs["b"])
    whole = without_machine(runs["abc"])
    assert both["benchmark"] == whole["benchmark"]
    assert both["config"]["command"] == whole["config"]["command"]
    assert both["config"]["models"] == whole["config"]["models"]
    assert both["config"]["joined_from"] == [runs["a"]["benchmark"], runs["b"]["benchmark"]]
    assert both["results"] == whole["results"]
    first = next(r for r in both["results"] if r["agent"])
    assert first["policy"] == "a" and "paired_minus_agents" in first
    # b was the first agent of its own run; joined, it is not judged against the others
    assert all("against_agents" not in r for r in both["results"] if r["policy"] == "b")


@needs_data("the RouterDC data")
def test_runs_of_other_seeds_worlds_or_results_are_not_joined(
    runs: dict[str, dict[str, Any]],
) -> None:
    with pytest.raises(NotJoinable, match="other worlds"):
        joined(runs["a"], runs["b_seed_2"])  # --seed is in the command
    other_seeds = copy.deepcopy(runs["b"])
    other_seeds["config"]["seeds"] = [7]
    with pytest.raises(NotJoinable, match="other environment seeds"):
        joined(runs["a"], other_seeds)
    with pytest.raises(NotJoinable, match="an agent in both runs: b, c"):
        joined(runs["b"], runs["abc"])
    moved = copy.deepcopy(runs["b"])
    rr = next(r for r in moved["results"] if r["policy"] == "RR")
    rr["per_run_qos"][0][0] += 1e-9  # a heuristic off by a hair: another world
    with pytest.raises(NotJoinable, match="RR at default came out differently"):
        joined(runs["a"], moved)
    fewer = copy.deepcopy(runs["b"])
    fewer["results"] = [r for r in fewer["results"] if r["setting"] == "default"]
    with pytest.raises(NotJoinable, match="other settings"):
        joined(runs["a"], fewer)


def test_a_run_without_agents_given_by_hand_is_refused_by_the_command(tmp_path: Path) -> None:
    plain = {
        "benchmark": "qos_routerdc",
        "config": {"command": "edgeroute bench qos", "models": {}, "seeds": [1]},
        "results": [],
    }
    (tmp_path / "plain.json").write_text(json.dumps(plain))
    done = edgeroute(
        "bench", "qos-join", str(tmp_path / "plain.json"), str(tmp_path / "plain.json")
    )
    assert done.returncode != 0
    assert "edgeroute bench qos-join: qos_routerdc: not a run of agents given with --model" in (
        done.stderr
    )
