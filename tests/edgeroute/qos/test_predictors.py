from __future__ import annotations

from pathlib import Path

import numpy as np

from edgeroute.qos.predictors import train_predictor
from policies.qos_text import MAX_IDS, VOCAB, hashed_ids
from tests.support import DATA_DIR, needs_data


def test_hashed_ids_are_stable_bounded_and_padded() -> None:
    a = hashed_ids("Write a Python function, please.")
    assert a.shape == (MAX_IDS,) and (a == hashed_ids("write a python FUNCTION, please.")).all()
    # 7 words (punctuation counts) and 6 bigrams: 13 ids, then padding.
    assert a[a > 0].max() < VOCAB and (a[:13] > 0).all() and (a[13:] == 0).all()


@needs_data("the quality data")
def test_the_predictor_beats_the_majority_bucket_and_exports(tmp_path: Path) -> None:
    r = train_predictor(DATA_DIR, "bow", epochs=3, out=tmp_path)
    assert r["length_top1"] > r["majority_length_top1"] + 0.03
    assert r["score_top1"] >= r["majority_score_top1"]
    import onnxruntime as ort

    session = ort.InferenceSession(str(tmp_path / "predictor.onnx"))
    ids = hashed_ids("Write a function that reverses a list.")[None]
    score, length = session.run(None, {"ids": ids, "expert": np.array([0, 5, 0])})
    assert score.shape == (3, 10) and length.shape == (3, 10)
    assert np.array_equal(score[0], score[2]) and not np.array_equal(score[0], score[1])


@needs_data("RouterDC's scores in router_quality/")
def test_on_graded_scores_the_predictor_orders_prompts_it_never_saw(tmp_path: Path) -> None:
    """RouterDC's scores are graded and differ by task: the held-out prompts' predicted
    expected score follows their true one, where on MBPP's 0/1 it barely does."""
    r = train_predictor(DATA_DIR, "bow", epochs=3, out=tmp_path, quality="routerdc")
    assert r["score_top1"] > r["majority_score_top1"] + 0.03
    assert r["score_corr"] > 0.2  # type: ignore[operator]
    assert r["test"] > 5000  # (prompt, model) rows of the agent's and evaluation prompts
