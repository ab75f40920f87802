"""Picking the served actors in the training worlds: the criterion, the worlds, refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from edgeroute.cli import main
from edgeroute.qos.config import Point, SelectConfig, TrainConfig, read_record, write_record
from edgeroute.qos.export import export_actor
from edgeroute.qos.model import QoSNet
from edgeroute.qos.select import picked, scored, shared_config, shortfalls
from policies.predictor import MODEL_ROOT
from tests.support import DATA_DIR, needs_data

ATTEMPT = MODEL_ROOT / "routerdc" / "attempts" / "big-batch-scrape-nodrop-ep1000"
RUN = ATTEMPT / "full-rel-300k-last-s0"
TINY = SelectConfig(episodes=2, keep=1, episode_len=64)
TWO_POINTS = (Point("default"), Point("N=9", n=9))


def test_a_candidate_weak_at_one_point_loses_to_one_level_everywhere() -> None:
    scores = {
        "steady": {"a": 0.40, "b": 0.40, "c": 0.40},
        "spiky": {"a": 0.50, "b": 0.50, "c": 0.25},  # the higher mean, one weak point
        "low": {"a": 0.30, "b": 0.30, "c": 0.30},
    }
    worst = shortfalls(scores)
    assert worst == pytest.approx({"steady": -0.10, "spiky": -0.15, "low": -0.20})
    assert picked(scores, 1) == ["steady"]
    assert picked(scores, 2) == ["steady", "spiky"]


def test_equal_worst_points_go_to_the_higher_mean_then_the_name() -> None:
    # (binary fractions, so that the ties are exact)
    scores = {"y": {"a": 0.5, "b": 0.25, "c": 0.5}, "x": {"a": 0.25, "b": 0.5, "c": 0.5}}
    assert shortfalls(scores) == {"y": -0.25, "x": -0.25}
    assert picked(scores, 2) == ["x", "y"]  # the means tie too
    scores["x"]["c"] = 0.375  # the same worst point, a lower mean
    assert shortfalls(scores)["x"] == -0.25
    assert picked(scores, 2) == ["y", "x"]


@pytest.mark.parametrize(
    "kw", [{"first_hardware": 1}, {"first_hardware": 9_999, "episodes": 5}, {"keep": 0}]
)
def test_the_criterion_refuses_the_checkpoints_hardware_held_out_hardware_and_nothing(
    kw: dict[str, int],
) -> None:
    with pytest.raises(ValueError):
        SelectConfig(**kw)


def with_config(tmp_path: Path, name: str, **changes: object) -> Path:
    """A copy of RUN whose record says it was trained with `changes`."""
    out = tmp_path / name
    shutil.copytree(RUN, out)
    record = read_record(out)
    record["config"] = {**record["config"], **changes}
    write_record(out, record)
    return out


def test_candidates_trained_in_another_world_are_refused(tmp_path: Path) -> None:
    same = with_config(tmp_path, "seed-7", seed=7, eval_every=123, keep="best")
    assert shared_config([RUN, same]) == TrainConfig.from_record(read_record(RUN)["config"])
    other = with_config(tmp_path, "other", scrape_ms=250.0)
    with pytest.raises(ValueError, match="scrape_ms"):
        shared_config([RUN, same, other])


def untrained(tmp_path: Path) -> Path:
    """RUN's record beside a fresh actor of its shape: near-uniform, never trained."""
    out = with_config(tmp_path, "untrained", seed=99)
    cfg = TrainConfig.from_record(read_record(out)["config"])
    torch.manual_seed(0)
    sac = cfg.sac()
    net = QoSNet(sac.encoder, sac.hidden, sac.heads, sac.layers, load=sac.load)
    if not sac.drop:
        net.head.forbid_drop()
    export_actor(net, out / "actor.onnx", cfg.speed_prior)
    return out


@needs_data("the RouterDC quality data")
def test_a_trained_run_is_picked_over_an_untrained_actor_and_the_scores_repeat(
    tmp_path: Path,
) -> None:
    fresh = untrained(tmp_path)
    first = scored([RUN, fresh], DATA_DIR, TINY, TWO_POINTS, progress=lambda _: None)
    assert set(first[str(RUN)]) == {"default", "N=9"}
    assert all(first[str(RUN)][p] > first[str(fresh)][p] for p in ("default", "N=9"))
    assert picked(first, 1) == [str(RUN)]
    # the same worlds for the same settings: a candidate scores the same again
    again = scored([fresh], DATA_DIR, TINY, TWO_POINTS, progress=lambda _: None)
    assert again[str(fresh)] == first[str(fresh)]


@needs_data("the RouterDC quality data")
def test_the_command_writes_the_scores_and_the_picks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fresh = untrained(tmp_path)
    out = tmp_path / "select.json"
    main(
        [
            "train", "qos-select", str(RUN), str(fresh), "--keep", "1", "--episodes", "1",
            "--out", str(out), "--data-dir", str(DATA_DIR),
        ]
    )  # fmt: skip
    record = json.loads(out.read_text())
    assert record["picked"] == [str(RUN)]
    assert record["worst_shortfall"][str(fresh)] < record["worst_shortfall"][str(RUN)]
    assert len(record["points"]) == 11
    assert "picked" in capsys.readouterr().out
