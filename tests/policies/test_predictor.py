"""The served predictor as a scorer: `predicted_quality`, and the `best_predicted`
preset (the QoS papers' BR baseline) built on it."""

from __future__ import annotations

import logging

import pytest

from policies import PipelineSpec, build_pipeline
from policies.plugins import PluginError
from policies.predictor import (
    DEFAULT_PREDICTOR_DIR,
    MODEL_ROOT,
    PredictedQuality,
    ScorePredictor,
    load_predictor,
)
from policies.types import BackendView, ClusterView, RequestInfo

PROMPT = "Write a python function to count the pairs in a list whose sum equals a target."


def fleet(predictor: ScorePredictor, n: int = 6) -> ClusterView:
    return ClusterView(
        tuple(
            BackendView(id=f"b{i}", models=frozenset({"edge"}), expert=m)
            for i, m in enumerate(predictor.models[:n])
        )
    )


def test_the_score_is_the_predicted_score_of_the_backends_model() -> None:
    predictor = load_predictor(DEFAULT_PREDICTOR_DIR)  # the preset's
    view = fleet(predictor)
    pipeline = build_pipeline(PipelineSpec(policy="best_predicted"))
    prompt = "What is the smallest possible integer value of $x$ if $12\\div(x+1)$ is an integer?"
    req = RequestInfo("edge", 20, prompt=prompt)
    scores = pipeline.scorers[0][0].score(req, view, view.backends)
    want = [s for s, _ in predictor.predict(prompt, list(range(6)))]
    assert scores == want and len(set(scores)) > 1  # the models differ on this prompt
    best = {f"b{i}" for i, s in enumerate(scores) if s == max(scores)}
    picked = {
        pipeline.decide(RequestInfo("edge", 20, prompt=prompt, entropy=e), view).backend_id
        for e in range(40)
    }
    assert picked == best  # every best one in turn (ties at random), no other


def test_a_world_folder_brings_its_own_predictor() -> None:
    spec = PipelineSpec.model_validate(
        {
            "policy": "best_predicted",
            "scorers": [
                {
                    "type": "predicted_quality",
                    "params": {"model": str(MODEL_ROOT / "routerdc")},
                }
            ],
        }
    )
    scorer = build_pipeline(spec).scorers[0][0]
    assert isinstance(scorer, PredictedQuality)
    assert scorer.predictor.models == load_predictor(MODEL_ROOT / "routerdc").models
    assert scorer.predictor.models != load_predictor(MODEL_ROOT).models
    with pytest.raises((PluginError, ValueError), match="latency_ms"):
        build_pipeline(
            PipelineSpec.model_validate(
                {
                    "policy": "best_predicted",
                    "scorers": [{"type": "predicted_quality", "params": {"latency_ms": 30}}],
                }
            )
        )


def test_no_candidates_no_scores() -> None:
    scorer = build_pipeline(PipelineSpec(policy="best_predicted")).scorers[0][0]
    assert scorer.score(RequestInfo("edge", 1, prompt=PROMPT), ClusterView(()), ()) == []


def test_a_model_the_predictor_does_not_know_is_predicted_as_the_average_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Not as the predictor's first model (what an unknown name used to get), which
    would claim that model's strengths for it; the operator hears of it once."""
    predictor = ScorePredictor(MODEL_ROOT)  # its own caches, so the log is this test's
    known = [BackendView(id=f"b{i}", models=frozenset({m})) for i, m in enumerate(predictor.models)]
    stranger = BackendView(id="x", models=frozenset({"a-model-nobody-trained-on"}))
    with caplog.at_level(logging.WARNING, logger="edgeroute.predictor"):
        for _ in range(3):
            got = predictor.predict_for(PROMPT, [known[0], stranger, known[1]])
    every = predictor.predict_for(PROMPT, known)
    mean = (
        sum(s for s, _ in every) / len(every),
        sum(n for _, n in every) / len(every),
    )
    assert got[1] == pytest.approx(mean)
    assert got[1] != every[0]  # not the first model's
    assert got[0] == every[0] and got[2] == every[1]
    warned = [r for r in caplog.records if "a-model-nobody-trained-on" in r.getMessage()]
    assert len(warned) == 1 and "x" in warned[0].getMessage()
    assert predictor.predict_for(PROMPT, []) == []


def test_best_predicted_routes_around_an_unknown_model_without_failing() -> None:
    predictor = load_predictor(MODEL_ROOT)
    view = ClusterView(
        (*fleet(predictor, 3).backends, BackendView(id="x", models=frozenset({"edge"}), expert="?"))
    )
    pipeline = build_pipeline(PipelineSpec(policy="best_predicted"))
    picked = {
        pipeline.decide(RequestInfo("edge", 20, prompt=PROMPT, entropy=e), view).backend_id
        for e in range(20)
    }
    assert picked and None not in picked


def test_a_model_is_known_by_its_full_name_or_its_name_after_the_organisation() -> None:
    predictor = load_predictor(DEFAULT_PREDICTOR_DIR)
    zephyr = predictor.models.index("HuggingFaceH4/zephyr-7b-beta")
    assert predictor.index(["HuggingFaceH4/zephyr-7b-beta"]) == zephyr
    assert predictor.index(["zephyr-7b-beta"]) == zephyr
    assert predictor.index(["beta"]) is None  # a tail of a name is another model
    assert predictor.index(["7b-beta", "", "edge"]) is None
    assert predictor.index(["edge", "zephyr-7b-beta"]) == zephyr  # the first it knows
