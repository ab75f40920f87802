"""The shadow-model experiment: precision and alignment move recall the way they must."""

from __future__ import annotations

import pytest

from edgeroute.sim.shadow import TinyMoE, init_weights, measure, quantise

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
    def r(scheme: str, kv: int | None) -> float:
        return mean(measure(CFG, scheme, None, kv, prompts=2, tokens=24).recall)

    fp16, int8, nf4 = r("fp16", None), r("int8", None), r("nf4", None)
    assert fp16 >= int8 > nf4
    assert fp16 > 0.99
    assert r("nf4", 1) > nf4


def test_an_fp16_shadow_aligned_every_token_recalls_nearly_everything() -> None:
    curve = measure(CFG, "fp16", 1, 1, prompts=1, tokens=8).recall
    assert len(curve) == 8
    assert all(0.99 <= c <= 1.0 for c in curve)


def test_layer_hits_need_every_expert_so_they_never_exceed_recall() -> None:
    r = measure(CFG, "nf4", None, None, prompts=2, tokens=16)
    assert 0 < r.layer_hit <= sum(r.recall) / len(r.recall) < 1
