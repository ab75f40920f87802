"""`bench qos-impact`: eq. 15's alarms scored against the true impact."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from edgeroute.bench.qos_impact import main, points_named, summary, trajectory
from edgeroute.qos.evaluate import BASELINES
from edgeroute.sim.edge import EdgeEnv, EdgeExpert, NoisyOracle, Task
from policies.predictor import MODEL_ROOT
from tests.support import needs_data


def test_precision_and_recall_count_the_right_decisions() -> None:
    decisions = [
        {"true": 0.5, "reached": 1.0},  # fired, costly
        {"true": 0.0, "reached": 0.7},  # fired, harmless
        {"true": 0.3, "reached": 0.0},  # silent, costly
        {"true": 0.0, "reached": 0.0},  # silent, harmless
    ]
    s = summary(decisions, "reached")
    assert s["fires"] == 0.5 and s["precision"] == 0.5 and s["recall"] == 0.5
    assert s["mean_estimate"] == pytest.approx(1.7 / 4)
    quiet = summary([{"true": 0.0, "reached": 0.0}], "reached")
    assert quiet["precision"] is None and quiet["recall"] is None


def test_a_loaded_trajectory_has_costly_decisions_and_eq15_reading_as_pushed_counts_less() -> None:
    rng = random.Random(3)
    pool = [
        Task(f"p{i}", rng.randint(20, 300), {"m": rng.random()}, {"m": rng.randint(20, 200)})
        for i in range(50)
    ]
    experts = [EdgeExpert("m", base=0.012, k1=2e-4, k2=3e-6, memory_tokens=4096)] * 2
    env = EdgeEnv(
        experts,
        pool,
        rate=20.0,
        latency_req=0.02,
        episode_len=200,
        predictor=NoisyOracle(),
        impact="hindsight",
    )
    rows = trajectory(env, BASELINES["SQF"], seed=5)
    assert rows and all(r["true"] >= 0 and r["pushed"] <= r["reached"] for r in rows)
    assert any(r["true"] > 0 for r in rows)  # a loaded world: some arrivals cost QoS
    assert all(r["room"] >= 0 for r in rows)  # the best in total is at least the own-best's
    assert all(r["room_hindsight"] >= 0 for r in rows)
    # in hindsight, the arrivals a request delayed count too: more decisions are costly
    assert sum(r["hindsight"] > 0 for r in rows) > sum(r["true"] > 0 for r in rows)
    # and in a loaded world a loss has several causes: shared, the charges add up to less
    assert 0 < sum(r["shared"] for r in rows) < sum(r["hindsight"] for r in rows)


def test_a_trajectory_needs_an_environment_that_records_the_hindsight() -> None:
    expert = EdgeExpert("m", base=0.01, k1=0.0, k2=0.0, memory_tokens=4096)
    env = EdgeEnv([expert], [Task("p", 10, {"m": 1.0}, {"m": 5})])
    with pytest.raises(ValueError, match="hindsight"):
        trajectory(env, BASELINES["SQF"], seed=0)


@needs_data("the RouterDC data")
def test_each_hardware_puts_the_trajectories_there(tmp_path: Path) -> None:
    """`--held-out-hardware` runs each seed on its held-out draw, `--engine-hardware`
    (here with `--scrape-ms`) on the live engines, the default on hardware seed 0: the
    results say so in their config and command, and their figures differ."""
    from edgeroute.sim.edge import Fleet, held_out_hardware

    written = {}
    for hardware, scrape in (("seed-0", None), ("held-out", None), ("engines", 1000.0)):
        path = tmp_path / f"{hardware}.json"
        main(True, 1, str(path), {}, "routerdc", Fleet(), hardware, scrape)  # type: ignore[arg-type]
        written[hardware] = json.loads(path.read_text())
    config = {k: v["config"] for k, v in written.items()}
    assert config["seed-0"]["hardware"] == [0]
    assert config["held-out"]["hardware"] == [held_out_hardware(0)]
    assert config["engines"]["hardware"] == "live engines"
    assert "--held-out-hardware" in config["held-out"]["command"]
    assert "--scrape-ms 1000 --engine-hardware" in config["engines"]["command"]
    assert "hardware" not in config["seed-0"]["command"]
    results = [v["results"] for v in written.values()]
    assert results[0] != results[1] and results[0] != results[2] and results[1] != results[2]
    for rows in results:
        assert all(r["room"] >= 0 and 0 <= r["room_share"] <= 1 for r in rows)
        assert all(r["room_hindsight"] >= 0 and 0 <= r["room_hindsight_share"] <= 1 for r in rows)
        assert all(r["mean_shared"] >= 0 for r in rows)


@needs_data("the RouterDC data")
def test_settings_pick_sweep_points_with_their_own_fleet_size_and_predictor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--settings N=12` measures that point alone on twelve engines, with agents read
    through the predictor they trained with (`--predictor`); the command says both,
    and the first seed."""
    from edgeroute.sim.edge import Fleet, engine_experts

    built: list[int] = []

    def engines(models: tuple[str, ...], n: int) -> Any:
        built.append(n)
        return engine_experts(models, n)

    monkeypatch.setattr("edgeroute.bench.qos_impact.engine_experts", engines)
    folder = MODEL_ROOT / "routerdc" / "expected-read"
    path = tmp_path / "n12.json"
    main(
        True,
        3,
        str(path),
        {"full": [folder]},
        "routerdc",
        Fleet(),
        "engines",
        1000.0,
        folder,
        ["N=12"],
    )
    run = json.loads(path.read_text())
    assert {r["setting"] for r in run["results"]} == {"N=12"}
    assert set(built) == {12}
    command = run["config"]["command"]
    assert "--predictor models/qos/routerdc/expected-read --settings N=12 " in command
    # the seeds it ran are those its command gives
    assert "--engine-hardware --seed 3 " in command and run["config"]["seeds"] == [103]


def test_by_default_the_points_are_the_six_expert_ones_and_a_label_must_be_known() -> None:
    assert [p.n for p in points_named(None)] == [6] * len(points_named(None))
    assert [p.label for p in points_named(["L=40ms", "default"])] == ["default", "L=40ms"]
    with pytest.raises(SystemExit, match="no sweep point N=7"):
        points_named(["N=7", "default"])
