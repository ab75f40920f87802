from __future__ import annotations

import filecmp
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from edgeroute.qos.predictors import (
    Predictor,
    expected,
    export_predictor,
    load_predictor_net,
    reread_predictor,
    train_predictor,
)
from edgeroute.sim.edge import load_tasks
from policies.predictor import MODEL_ROOT, ScorePredictor
from policies.qos_text import MAX_IDS, VOCAB, gram_ids, hashed_ids
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
    ids = gram_ids("Write a function that reverses a list.")[None]
    buckets = session.run(None, {"ids": ids, "expert": np.array([0, 5, 0])})[0]
    assert buckets.shape == (3, 2) and buckets.dtype == np.int64
    assert np.array_equal(buckets[0], buckets[2])


def _served_and_module(
    session: Any, net: Predictor, prompt: str
) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
    """The graph's buckets for `prompt` on every expert (its unpadded ids, as served),
    and the module's score and length logits on the padded ids."""
    experts = np.arange(net.expert.num_embeddings)
    served = session.run(None, {"ids": ScorePredictor.prompt_ids(prompt), "expert": experts})[0]
    with torch.no_grad():
        padded = torch.from_numpy(hashed_ids(prompt)[None].repeat(len(experts), 0))
        score, length = net(padded, torch.from_numpy(experts))
    return served, score, length


@pytest.mark.parametrize("quality", ["routerbench", "routerdc"])
def test_the_served_predictor_picks_the_buckets_its_module_does(
    tmp_path: Path, quality: str
) -> None:
    """The hand-written graph (the text pooled once, the expert's part of the first
    layer looked up) against the PyTorch module on padded ids, for prompts of every
    size, an empty one included, on every expert; and its weights read back."""
    folder = MODEL_ROOT / ("routerdc" if quality == "routerdc" else "")
    net = load_predictor_net(folder / "predictor.onnx").eval()
    export_predictor(net, tmp_path / "predictor.onnx")
    import onnxruntime as ort

    session = ort.InferenceSession(str(tmp_path / "predictor.onnx"))
    rng = np.random.default_rng(0)
    words = [
        "write",
        "a",
        "python",
        "function",
        "to",
        "sort",
        "the",
        "list",
        "of",
        "numbers",
        "and",
        "return",
        "it",
    ]
    prompts = ["", "?"] + [" ".join(rng.choice(words, rng.integers(1, 200))) for _ in range(30)]
    for prompt in prompts:
        served, score, length = _served_and_module(session, net, prompt)
        assert np.array_equal(served, np.stack([score.argmax(-1), length.argmax(-1)], 1)), prompt
    assert filecmp.cmp(tmp_path / "predictor.onnx", folder / "predictor.onnx", shallow=False)


@needs_data("RouterDC's scores in router_quality/")
def test_on_graded_scores_the_predictor_orders_prompts_it_never_saw(tmp_path: Path) -> None:
    """RouterDC's scores are graded and differ by task: the held-out prompts' predicted
    expected score follows their true one, where on MBPP's 0/1 it barely does."""
    r = train_predictor(DATA_DIR, "bow", epochs=3, out=tmp_path, quality="routerdc")
    assert r["score_top1"] > r["majority_score_top1"] + 0.03
    assert r["score_corr"] > 0.2
    assert r["test"] > 5000  # (prompt, model) rows of the agent's and evaluation prompts


def test_the_expected_read_is_the_mean_bucket_rounded(tmp_path: Path) -> None:
    """The same weights read out another way: each expert's expected bucket under the
    classifier's distribution, rounded; the argmax re-read is the committed file."""
    folder = MODEL_ROOT / "routerdc"
    reread_predictor(folder, tmp_path, "expected")
    record = json.loads((tmp_path / "predictor.json").read_text())
    assert record["read"] == "expected" and record["weights_from"] == str(folder)
    net = load_predictor_net(tmp_path / "predictor.onnx").eval()
    import onnxruntime as ort

    session = ort.InferenceSession(str(tmp_path / "predictor.onnx"))
    spread = 0
    for prompt in ["", "Solve 3x + 5 = 11.", "Write a JavaScript function that sorts"]:
        served, score, length = _served_and_module(session, net, prompt)
        want = torch.stack([expected(score), expected(length)], 1).round().long().numpy()
        assert np.array_equal(served, want), prompt
        spread += int((served != np.stack([score.argmax(-1), length.argmax(-1)], 1)).sum())
    assert spread > 0  # not the argmax read under another name
    again = tmp_path / "argmax"
    again.mkdir()
    reread_predictor(folder, again, "argmax")
    assert filecmp.cmp(again / "predictor.onnx", folder / "predictor.onnx", shallow=False)


@needs_data("RouterDC's scores in router_quality/")
def test_the_expected_read_picks_better_experts_than_the_argmax(tmp_path: Path) -> None:
    """On the agent's prompts (never the predictor's), the expert each read predicts
    best answers better by the expected read: the argmax read mostly says 0 or 9 and
    leaves the choice to ties."""
    reread_predictor(MODEL_ROOT / "routerdc", tmp_path, "expected")
    reads = {
        "argmax": ScorePredictor(MODEL_ROOT / "routerdc"),
        "expected": ScorePredictor(tmp_path),
    }
    tasks = load_tasks(DATA_DIR, split="agent", quality="routerdc")
    picked: dict[str, list[float]] = {name: [] for name in reads}
    for task in tasks:
        for name, predictor in reads.items():
            scores = [s for s, _ in predictor.predict(task.prompt, range(len(predictor.models)))]
            best = predictor.models[int(np.argmax(scores))]
            picked[name].append(task.scores[best])
    assert np.mean(picked["expected"]) > np.mean(picked["argmax"]) + 0.05
