"""The served QoS policy's predictor: one run per request, whatever the backends."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from policies.qos_drl import DEFAULT_MODEL_DIR, QoSDRL, ScorePredictor


def test_backends_sharing_a_model_share_one_prediction_row() -> None:
    predictor = ScorePredictor()
    experts = [3, 1, 3, 0, 5, 1, 2, 4, 0, 6, 7, 3]
    for prompt in ("Write a function that sorts a list.", "word " * 400, ""):
        together = predictor.predict(prompt, experts)
        alone = [predictor.predict(prompt, [e])[0] for e in experts]
        assert together == alone
    assert predictor.predict("x", []) == []


def test_an_actor_uses_the_predictor_of_the_model_folder_its_run_is_in(tmp_path: Path) -> None:
    """A run in `<world>/runs/<run>/` trained with `<world>`'s predictor; a lone actor
    falls back to the one the gateway ships."""
    world = tmp_path / "world"
    run = world / "runs" / "full-s0"
    run.mkdir(parents=True)
    shutil.copy(DEFAULT_MODEL_DIR / "actor.onnx", run / "actor.onnx")
    routerdc = json.loads((DEFAULT_MODEL_DIR / "routerdc" / "predictor.json").read_text())
    for name in ("predictor.onnx", "predictor.json"):
        shutil.copy(DEFAULT_MODEL_DIR / "routerdc" / name, world / name)
    assert QoSDRL(run).predictor.models == routerdc["models"]
    attempt = world / "attempts" / "some-set" / "full-s0"  # deeper: still the world's
    shutil.copytree(run, attempt)
    assert QoSDRL(attempt).predictor.models == routerdc["models"]
    lone = tmp_path / "lone"
    lone.mkdir()
    shutil.copy(DEFAULT_MODEL_DIR / "actor.onnx", lone / "actor.onnx")
    assert QoSDRL(lone).predictor.models == QoSDRL().predictor.models != routerdc["models"]
