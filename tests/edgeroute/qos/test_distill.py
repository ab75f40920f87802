"""One actor trained to act as another: the states it learns from, the fit, the file."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from edgeroute.cli import main
from edgeroute.qos.config import DistillConfig, TrainConfig, read_record
from edgeroute.qos.distill import OnnxActor, Student, fitted, split, visited
from policies.predictor import MODEL_ROOT, predictor_dir
from policies.qos_drl import QoSDRL
from policies.types import RequestInfo
from tests.policies.test_qos_graph import random_view
from tests.support import DATA_DIR, needs_data

pytestmark = needs_data("the RouterDC quality data")

ATTEMPT = MODEL_ROOT / "routerdc" / "attempts" / "big-batch-scrape-nodrop-ep1000"
RUN = ATTEMPT / "full-rel-300k-last-s0"
SMALL = DistillConfig(states=1_500, epochs=5, batch=32, seed=3)


def run_config() -> TrainConfig:
    return TrainConfig.from_record(read_record(RUN)["config"])


def test_the_states_are_the_teachers_worlds_and_its_logits_on_them() -> None:
    teacher = OnnxActor(RUN / "actor.onnx")
    cfg = replace(run_config(), envs=4)
    obs, logits = visited(teacher, cfg, replace(SMALL, states=400), DATA_DIR)
    assert logits.shape == (400, cfg.experts + 1)
    assert obs["queues"].shape[0] == 400
    # each row's logits are the teacher's on that row's state
    rows = np.arange(0, 400, 37)
    np.testing.assert_allclose(teacher.logits({k: v[rows] for k, v in obs.items()}), logits[rows])
    # the worlds move: states differ, and an actor that never drops was never shown one
    assert len({obs["experts"][i].tobytes() for i in range(400)}) > 300
    assert (logits[:, 0] < -1e8).all()


def test_the_fit_comes_closer_to_the_teacher_than_an_untrained_actor() -> None:
    teacher = OnnxActor(RUN / "actor.onnx")
    cfg = replace(run_config(), envs=4)
    obs, logits = visited(teacher, cfg, SMALL, DATA_DIR)
    _, untrained = fitted(cfg, replace(SMALL, epochs=0), obs, logits)
    _, trained = fitted(cfg, SMALL, obs, logits)
    assert trained["kl"] < untrained["kl"] / 2
    assert trained["argmax_agreement"] > untrained["argmax_agreement"]


def test_a_student_acting_visits_its_own_states_labelled_by_the_teacher() -> None:
    """DAgger's rounds: the worlds are acted by the student, the labels are the
    teacher's on the states the student led to."""
    teacher = OnnxActor(RUN / "actor.onnx")
    cfg = replace(run_config(), envs=4)
    small = replace(SMALL, states=200)
    own, _ = visited(teacher, cfg, small, DATA_DIR)
    student, _ = fitted(cfg, replace(small, epochs=0), *visited(teacher, cfg, small, DATA_DIR))
    led, labels = visited(teacher, cfg, small, DATA_DIR, Student(student))
    np.testing.assert_allclose(teacher.logits(led), labels)
    # the same worlds and draws, another actor: after the first steps, other states
    assert np.array_equal(own["experts"][:4], led["experts"][:4])
    assert not np.array_equal(own["queues"], led["queues"])


def test_later_rounds_keep_their_held_out_rows_apart() -> None:
    first, first_held = split(1000, SMALL)
    again, again_held = split(1000, SMALL)
    later, later_held = split(1000, SMALL, 1)
    assert np.array_equal(first, again) and np.array_equal(first_held, again_held)
    assert not np.array_equal(first_held, later_held)
    assert len(first_held) == 50 and not set(first) & set(first_held)
    assert sorted([*later, *later_held]) == list(range(1000))


def test_the_command_writes_an_actor_the_gateway_serves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("predictor.onnx", "predictor.json"):  # the world's predictor, above the run
        shutil.copy(predictor_dir(RUN) / name, tmp_path / name)
    out = tmp_path / "distilled"
    main(
        ["train", "qos-distill", str(RUN), "--out", str(out), "--states", "800",
         "--epochs", "2", "--rounds", "2", "--data-dir", str(DATA_DIR)]
    )  # fmt: skip
    printed = capsys.readouterr().out
    assert "argmax agreement" in printed and "distilled" in printed
    record = read_record(out)
    assert record["distilled"]["teacher"] == str(RUN)
    assert record["distilled"]["states"] == 800
    assert len(record["distilled"]["rounds_measured"]) == 2
    assert "round 2  epoch  1/1" in printed
    assert record["onnx_parity_max_abs"] < 1e-4
    assert record["config"]["variant"] == "full"
    policy = QoSDRL(out)
    view = random_view(np.random.default_rng(0), policy.predictor.models, 6, now=10.0)
    decision = policy.decide(RequestInfo("m", 100, prompt="sort a list", now=10.0), view)
    assert decision.backend_id in {b.id for b in view.backends}
