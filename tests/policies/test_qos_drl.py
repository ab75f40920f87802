"""The served QoS policy's predictor: one run per request, whatever the backends."""

from __future__ import annotations

from policies.qos_drl import ScorePredictor


def test_backends_sharing_a_model_share_one_prediction_row() -> None:
    predictor = ScorePredictor()
    experts = [3, 1, 3, 0, 5, 1, 2, 4, 0, 6, 7, 3]
    for prompt in ("Write a function that sorts a list.", "word " * 400, ""):
        together = predictor.predict(prompt, experts)
        alone = [predictor.predict(prompt, [e])[0] for e in experts]
        assert together == alone
    assert predictor.predict("x", []) == []
