"""The shadow-model experiment: precision and alignment move recall the way they must,
on random weights and on the trained model the benchmark uses."""

from __future__ import annotations

import pytest
import torch

from edgeroute.bench.odmoe import MODEL_FILE
from edgeroute.sim.moe_lm import MODEL, forward, load
from edgeroute.sim.shadow import (
    Decoder,
    TinyMoE,
    init_weights,
    measure,
    quantise,
    random_prompts,
)

CFG = TinyMoE(layers=4, dim=64, ffn=128, vocab=256)


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def test_quantised_weights_keep_shape_and_lose_precision_in_order() -> None:
    w = init_weights(CFG)
    errs = {}
    for scheme in ("fp16", "int8", "nf4"):
        q = quantise(w, scheme)
        assert q.keys() == w.keys()
        assert all(q[k].shape == w[k].shape for k in w)
        errs[scheme] = max(float((q[k] - w[k]).abs().max()) for k in w)
    assert 0 < errs["fp16"] < errs["int8"] < errs["nf4"]


def test_unknown_scheme_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown scheme"):
        quantise(init_weights(CFG), "int3")


def test_recall_falls_with_precision_and_kv_alignment_recovers_it() -> None:
    w, prompts = init_weights(CFG), random_prompts(CFG, 2, 0)

    def r(scheme: str, kv: int | None) -> float:
        return mean(measure(CFG, w, scheme, None, kv, prompts, tokens=24).recall)

    fp16, int8, nf4 = r("fp16", None), r("int8", None), r("nf4", None)
    assert fp16 >= int8 > nf4
    assert fp16 > 0.99
    assert r("nf4", 1) > nf4


def test_layer_hits_need_every_expert_so_they_never_exceed_recall() -> None:
    r = measure(CFG, init_weights(CFG), "nf4", None, None, random_prompts(CFG, 2, 0), 16)
    assert 0 < r.layer_hit <= sum(r.recall) / len(r.recall) < 1
    assert len(r.per_prompt) == 2 and mean(r.per_prompt) == pytest.approx(mean(r.recall))


def test_the_training_forward_is_the_decoder_the_shadow_runs() -> None:
    """One architecture: the batched forward that trains the model chooses the same
    experts and the same next token as the step-by-step decoder that measures it."""
    weights = load(MODEL_FILE)
    text = list(b"Natalia sold clips to 48 of her friends in April")
    logits, _, chosen = forward(MODEL, weights, torch.tensor([text]))
    decoder = Decoder(MODEL, weights)
    for i, token in enumerate(text):
        nxt, experts = decoder.step(token)
        assert experts == [set(c[i].tolist()) for c in chosen]
    assert nxt == int(logits[0, -1].argmax())


def test_the_trained_model_routes_by_its_input_not_at_random() -> None:
    """Learned routing: different text sends tokens to different experts, and no expert
    of a layer is left idle or takes everything."""
    weights = load(MODEL_FILE)
    code = torch.tensor([list(b"def add(a, b):\n    return a + b\n" * 3)])
    prose = torch.tensor([list(b"She sells the remaining eggs at the market for $2 each." * 2)])
    shares = []
    for text in (code, prose):
        _, _, chosen = forward(MODEL, weights, text)
        shares.append(
            torch.stack([torch.bincount(c.reshape(-1), minlength=MODEL.experts) for c in chosen])
            .float()
            .div(2 * text.shape[1])
        )
    assert (shares[0] - shares[1]).abs().sum(-1).mean() > 0.2  # inputs route differently
    assert float(shares[1].max()) < 0.5  # top-2: a share of 0.5 would be every token


def test_an_fp16_shadow_of_the_trained_model_aligned_every_token_recalls_nearly_all() -> None:
    weights = load(MODEL_FILE)
    prompt = [list(b"Question: Tom has 3 apples and buys 4 more. How many?")]
    curve = measure(MODEL, weights, "fp16", 1, 1, prompt, tokens=12).recall
    assert len(curve) == 12
    assert mean(curve) > 0.98
