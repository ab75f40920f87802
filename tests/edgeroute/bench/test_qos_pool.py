"""Pooling live QoS runs: the committed default runs give the verdict docs/research.md
took by hand, and runs of other settings or shared seeds are refused."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from edgeroute.bench.qos_pool import NotPoolable, pool, pooled_name
from edgeroute.results_io import RESULTS
from edgeroute.stats import shown

# (17), (20) and (21) of docs/research.md: the live default, 10 + 20 + 20 seeds.
DEFAULT_RUNS = [
    "qos_live_routerdc_seed-1801_ep-full_ep-dsa_ep-dsa-drawn_ep-baseline_ep-baseline-drawn",
    "qos_live_routerdc_seed-2101_ep-full_ep-dsa_ep-baseline",
    "qos_live_routerdc_seed-2201_ep-full_ep-dsa_ep-baseline",
]


def load(name: str) -> dict[str, Any]:
    payload: dict[str, Any] = json.loads((RESULTS / f"{name}.json").read_text())
    return payload


@pytest.fixture
def runs() -> list[dict[str, Any]]:
    return [load(n) for n in DEFAULT_RUNS]


def by_policy(summary: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["policy"]: r for r in summary}


def test_the_default_runs_pool_to_the_verdict_taken_by_hand(runs: list[dict[str, Any]]) -> None:
    config, summary = pool(runs)
    rows = by_policy(summary)
    assert len(config["seeds"]) == 50
    # The drawn baselines ran in (17) only, so they are left out.
    assert list(rows) == ["RR", "least_load", "BR", "ep-full", "ep-dsa", "ep-baseline"]
    assert list(config["models"]) == ["ep-full", "ep-dsa", "ep-baseline"]
    for name, row in rows.items():
        seeds = [
            q
            for run in runs
            for r in run["results"]
            if r["policy"] == name
            for q in r["per_seed_qos"]
        ]
        assert row["per_seed_qos"] == seeds
        assert row["qos_ci"] == shown(seeds)
        assert row["requests"] == 50_000
    # docs/research.md, "What (21) showed"
    assert rows["ep-full"]["qos_ci"] == "0.381 ± 0.0055"
    assert rows["ep-dsa"]["qos_ci"] == "0.362 ± 0.0084"
    assert rows["ep-baseline"]["qos_ci"] == "0.353 ± 0.0043"
    assert rows["ep-full"]["paired_minus_agents"] == (
        "ep-dsa: 0.0199 ± 0.0093 (above on 30 of 50); "
        "ep-baseline: 0.0284 ± 0.004 (above on 49 of 50)"
    )
    # a run's mean latency, weighted by its seeds
    expected = (
        sum(
            len(run["config"]["seeds"]) * by_policy(run["results"])["ep-full"]["latency_ms"]
            for run in runs
        )
        / 50
    )
    assert rows["ep-full"]["latency_ms"] == pytest.approx(expected)
    assert pooled_name(runs, list(config["models"])) == (
        "qos_live_routerdc_pooled-1801-2101-2201_ep-full_ep-dsa_ep-baseline"
    )


def test_each_student_is_read_on_the_seeds_it_served_in_its_own_run() -> None:
    """(166)'s 10 seeds and (167)'s 20 were each served by the students in turn from
    their own first seed, so the pooled 30 are not in turn: seed 11 of the pool was the
    first student's. Pooled, each student keeps its seeds (docs/research.md, "What
    (167) showed": the full agent's students 0.219, 0.237, 0.224 on the 20 alone)."""
    first = load("qos_live_routerdc_L-25ms_x5_seed-3731_dg5-full_dg5-dsa_dg5-baseline")
    second = load("qos_live_routerdc_L-25ms_x5_seed-3741_dg5-full_dg5-dsa_dg5-baseline")
    alone = by_policy(second["results"])["dg5-full"]["per_seed_qos"]
    assert [round(sum(alone[k::3]) / len(alone[k::3]), 3) for k in range(3)] == [
        0.219,
        0.237,
        0.224,
    ]
    _, summary = pool([first, second])
    full = by_policy(summary)["dg5-full"]
    assert full["per_seed_run"] == [k % 3 for k in range(10)] + [k % 3 for k in range(20)]
    each = [
        [
            q
            for run in (first, second)
            for q in by_policy(run["results"])["dg5-full"]["per_seed_qos"][k::3]
        ]
        for k in range(3)
    ]
    assert full["by_run_qos"] == ", ".join(f"{sum(q) / len(q):.3f}" for q in each)
    in_turn = full["per_seed_qos"]
    assert full["by_run_qos"] != ", ".join(
        f"{sum(in_turn[k::3]) / len(in_turn[k::3]):.3f}" for k in range(3)
    )
    assert by_policy(summary)["RR"]["by_run_qos"] == ""


def test_the_answers_score_and_engines_pool_where_a_run_recorded_them(
    runs: list[dict[str, Any]],
) -> None:
    """Runs from before `answered_score` was recorded pool with those after: the pooled
    mean reads the seeds that have it, and each seed keeps its engines' shares."""
    first, second = copy.deepcopy(runs[0]), runs[1]
    row = by_policy(first["results"])["ep-full"]
    seeds = len(first["config"]["seeds"])
    row["per_seed_answered_score"] = [0.5] * (seeds - 1) + [0.8]
    row["per_seed_engine_shares"] = [{"a": 1.0}] * seeds
    _, summary = pool([first, second])
    full = by_policy(summary)["ep-full"]
    assert full["answered_score"] == f"{(0.5 * (seeds - 1) + 0.8) / seeds:.3f}"
    assert full["per_seed_engine_shares"][:seeds] == [{"a": 1.0}] * seeds
    assert full["per_seed_engine_shares"][seeds:] == [None] * len(second["config"]["seeds"])
    assert by_policy(summary)["RR"]["answered_score"] == ""


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("rate", 6.0, "rate"),
        ("engines", 3, "engines"),
        ("latency_ms", 40.0, "latency_ms"),
        ("speedup", 5.0, "speedup"),
        ("arrivals", "paced", "arrivals"),  # runs that slept each gap against paced ones
        ("command", "edgeroute bench qos --live --quality routerbench", "quality"),
    ],
)
def test_runs_of_another_setting_are_refused(
    runs: list[dict[str, Any]], key: str, value: Any, named: str
) -> None:
    other = copy.deepcopy(runs[1])
    other["config"][key] = value
    with pytest.raises(NotPoolable, match=named):
        pool([runs[0], other])


def test_a_seed_in_two_runs_is_refused(runs: list[dict[str, Any]]) -> None:
    with pytest.raises(NotPoolable, match="seed 2101 is in two runs"):
        pool([runs[1], runs[1]])


def test_an_agent_that_is_other_models_is_refused(runs: list[dict[str, Any]]) -> None:
    other = copy.deepcopy(runs[2])
    other["config"]["models"]["ep-dsa"] = ["models/qos/routerdc/runs/dsa-s0"]
    with pytest.raises(NotPoolable, match="ep-dsa is other models"):
        pool([runs[1], other])


def test_one_run_is_not_a_pool(runs: list[dict[str, Any]]) -> None:
    with pytest.raises(NotPoolable, match="at least two"):
        pool(runs[:1])


def test_the_command_refuses_with_a_message_and_writes_nothing(
    runs: list[dict[str, Any]], tmp_path: Path
) -> None:
    files: list[str] = []
    for k in (1, 1):
        f = tmp_path / f"run{len(files)}.json"
        f.write_text(json.dumps(runs[k]))
        files.append(str(f))
    out = tmp_path / "pooled.json"
    done = subprocess.run(
        [sys.executable, "-m", "edgeroute.cli", "bench", "qos-pool", *files, "--json", str(out)],
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0
    assert "edgeroute bench qos-pool: seed 2101 is in two runs" in done.stderr
    assert not out.exists()
