"""Several runs served as one actor: the mean of their policies, served as any actor."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from onnxruntime import InferenceSession

from edgeroute.cli import main
from edgeroute.qos.config import read_record, trained_fleet, trained_latencies
from edgeroute.qos.ensemble import common_config, ensemble_graph, write_ensemble
from edgeroute.qos.export import example
from policies.onnx_session import one_thread_session
from policies.predictor import MODEL_ROOT, ScorePredictor, predictor_dir
from policies.qos_drl import QoSDRL
from policies.qos_graph import TRAINED_WITH_SPEED_PRIOR
from policies.types import RequestInfo
from tests.policies.test_qos_graph import random_view

ATTEMPT = MODEL_ROOT / "routerdc" / "attempts" / "big-batch-scrape-nodrop-ep1000"
FULL = [ATTEMPT / f"full-rel-300k-last-s{s}" for s in range(3)]


def logits(s: InferenceSession, states: dict[str, np.ndarray]) -> np.ndarray:
    feeds = {i.name: states[i.name] for i in s.get_inputs()}
    out: np.ndarray = s.run(["logits"], feeds)[0]
    return out


def log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(axis=-1, keepdims=True)
    out: np.ndarray = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return out


@pytest.mark.parametrize("n", [3, 6, 12])
def test_the_ensemble_is_the_log_of_its_members_mean_probabilities(n: int) -> None:
    states = example(64, n, seed=n)
    members = [logits(one_thread_session(run / "actor.onnx"), states) for run in FULL]
    # log of the mean, in logs: these actors never drop, so the drop's is about -1e9
    mean = np.logaddexp.reduce([log_softmax(m) for m in members], axis=0) - np.log(len(FULL))
    got = logits(one_thread_session(ensemble_graph([run / "actor.onnx" for run in FULL])), states)
    assert got.shape == (64, n + 1)
    np.testing.assert_allclose(got, mean, rtol=1e-6, atol=1e-5)
    # where the members disagree on their first action, the ensemble is none of them alone
    firsts = np.stack([m.argmax(axis=1) for m in members])
    assert (firsts != firsts[0]).any()


def test_an_ensemble_of_one_ranks_as_its_member() -> None:
    states = example(64, 6, seed=1)
    alone = logits(one_thread_session(FULL[0] / "actor.onnx"), states)
    one = logits(one_thread_session(ensemble_graph([FULL[0] / "actor.onnx"])), states)
    np.testing.assert_allclose(one, log_softmax(alone), atol=1e-5)


def test_members_that_read_other_inputs_or_trained_otherwise_are_refused() -> None:
    baseline = ATTEMPT / "baseline-rel-300k-last-s0"
    with pytest.raises(ValueError, match="reads other inputs"):
        ensemble_graph([FULL[0] / "actor.onnx", baseline / "actor.onnx"])
    with pytest.raises(ValueError, match=r"trained otherwise.*variant"):
        common_config({r: read_record(r) for r in (FULL[0], ATTEMPT / "dsa-rel-300k-last-s0")})
    with pytest.raises(ValueError, match="at least one"):
        ensemble_graph([])


def test_members_served_otherwise_are_refused(tmp_path: Path) -> None:
    """An actor trained with the speed prior is always served with it (its metadata
    says so): it cannot join members that are served without."""
    import onnx
    from onnx import helper

    model = onnx.load(str(FULL[1] / "actor.onnx"))
    helper.set_model_props(model, {TRAINED_WITH_SPEED_PRIOR: "true"})
    onnx.save(model, str(tmp_path / "actor.onnx"))
    with pytest.raises(ValueError, match="metadata differs"):
        ensemble_graph([FULL[0] / "actor.onnx", tmp_path / "actor.onnx"])
    both = ensemble_graph([tmp_path / "actor.onnx", tmp_path / "actor.onnx"])
    assert (
        one_thread_session(both).get_modelmeta().custom_metadata_map[TRAINED_WITH_SPEED_PRIOR]
        == "true"
    )


def test_the_gateway_policy_serves_an_ensemble_and_follows_its_mean(tmp_path: Path) -> None:
    """Served through `QoSDRL` (predictor joined at load), the ensemble's decision is
    the action its members' mean probabilities put first, view after view."""
    out = tmp_path / "ens"
    record = write_ensemble(FULL, out, commit="test")
    assert record["ensemble"]["seeds"] == [0, 1, 2]
    assert "seed" not in record["config"]
    # what the benchmarks read of a run's record, they read of the ensemble's alike
    assert trained_fleet(out) == trained_fleet(FULL[0])
    assert trained_latencies(out) == trained_latencies(FULL[0])
    predictor = ScorePredictor(predictor_dir(FULL[0]))
    ensemble = QoSDRL(out, predictor=predictor)
    members = [QoSDRL(run, predictor=predictor) for run in FULL]
    rng = np.random.default_rng(7)
    chosen, overruled = set(), 0
    for i in range(60):
        now = 100.0 + i
        view = random_view(rng, predictor.models, int(rng.integers(2, 9)), now)
        req = RequestInfo("m", int(rng.integers(1, 4000)), prompt="count the pairs", now=now)
        scored = [m._scored(req, view) for m in members]
        assert all(isinstance(s, tuple) for s in scored)
        candidates = scored[0][0]  # type: ignore[index]
        mean = np.mean([np.exp(log_softmax(s[2])) for s in scored], axis=0)  # type: ignore[index]
        best = int(np.argmax(mean))
        decision = ensemble.decide(req, view)
        assert decision.backend_id == (None if best == 0 else candidates[best - 1].id), i
        chosen.add(decision.backend_id)
        alone = [int(np.argmax(s[2])) for s in scored]  # type: ignore[index]
        overruled += alone.count(best) < len(alone)
    assert len(chosen) > 1  # the views differ enough for the choice to move
    assert overruled > 0  # and some members are outvoted


def test_the_command_writes_a_served_folder_and_refuses_mixed_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    world = tmp_path / "world"
    main(["train", "qos-ensemble", *map(str, FULL[:2]), "--out", str(world)])
    assert "2 runs served as one (seeds 0, 1)" in capsys.readouterr().out
    assert json.loads((world / "training.json").read_text())["ensemble"]["commits"] == [
        read_record(r)["commit"] for r in FULL[:2]
    ]
    with pytest.raises(SystemExit, match="trained otherwise"):
        main(
            [
                "train",
                "qos-ensemble",
                str(FULL[0]),
                str(ATTEMPT / "dsa-rel-300k-last-s0"),
                "--out",
                str(tmp_path / "mixed"),
            ]
        )
    assert not (tmp_path / "mixed" / "actor.onnx").exists()
