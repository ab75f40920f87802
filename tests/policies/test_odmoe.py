"""OD-MoE's pipeline timing against hand-computed timelines."""

from __future__ import annotations

import pytest

from policies.odmoe import (
    PipelineConfig,
    alignment_seconds,
    decode_token,
    max_load_seconds,
    token_seconds,
)


def test_eq_1_matches_the_papers_worked_example() -> None:
    cfg = PipelineConfig(workers=8, group_size=2, t_main=1.0, t_worker=10.0)
    assert max_load_seconds(cfg) == 4 * 1.0 + 3 * 10.0


def test_loading_inside_the_window_never_stalls() -> None:
    # 4 groups, t_M = 4 ms, t_W = 3 ms: window 4*4 + 3*3 = 25 ms; a load takes 20 ms.
    cfg = PipelineConfig(t_main=0.004, t_worker=0.003, expert_bytes=0.020 * 12e9)
    assert cfg.load_seconds < max_load_seconds(cfg)
    timeline = decode_token(cfg, 32, group_free=[-1.0] * 4)  # loads started long before
    assert all(layer.stall == pytest.approx(0.0) for layer in timeline)
    assert token_seconds(cfg, 32) >= 32 * (0.004 + 0.003)


def test_steady_state_stall_is_the_load_beyond_the_window() -> None:
    # Loading takes 40 ms against a 25 ms window. Once one group stalls, the others'
    # loads gain the same slack, so per round of 4 layers the pipeline loses exactly
    # load - window = 15 ms, on one layer, and a round lasts a group's cycle: its load
    # plus its compute, 40 + 3 ms.
    cfg = PipelineConfig(t_main=0.004, t_worker=0.003, expert_bytes=0.040 * 12e9)
    timeline = decode_token(cfg, 64, group_free=[-1.0] * 4)
    for r in range(8, 15):
        round_ = timeline[4 * r : 4 * r + 4]
        assert sum(x.stall for x in round_) == pytest.approx(0.040 - max_load_seconds(cfg))
        assert round_[-1].compute_end - timeline[4 * r - 1].compute_end == pytest.approx(
            0.040 + 0.003
        )


def test_a_misprediction_waits_for_a_full_reload_after_gating() -> None:
    cfg = PipelineConfig(t_main=0.004, t_worker=0.003, expert_bytes=0.010 * 12e9)
    hit = decode_token(cfg, 8, group_free=[-1.0] * 4)
    miss = decode_token(cfg, 8, mispredicted=[False, False, True], group_free=[-1.0] * 4)
    assert hit[2].stall == pytest.approx(0.0)
    assert miss[2].stall == pytest.approx(cfg.load_seconds)
    assert miss[-1].compute_end - hit[-1].compute_end == pytest.approx(cfg.load_seconds)


def test_kv_alignment_departs_the_shadow_late_and_delays_the_first_loads() -> None:
    # The paper's figures: 8 KB per token per layer, 32 layers, 1 Gbps: 256 KB, 2.048 ms.
    cfg = PipelineConfig(t_main=0.004, t_worker=0.003, expert_bytes=0.010 * 12e9)
    delay = alignment_seconds(cfg, 32, kv=True)
    assert delay == pytest.approx(256e3 * 8 / 1e9)
    assert alignment_seconds(cfg, 32, kv=False) == 0.0
    prompt = decode_token(cfg, 8)
    late = decode_token(cfg, 8, prediction_delay=delay)
    # Layer 0: main part ends at 4 ms; its expert loads from 0 (10 ms) or from 2.048 ms.
    assert prompt[0].stall == pytest.approx(0.010 - 0.004)
    assert late[0].stall == pytest.approx(0.010 + delay - 0.004)
    slower = token_seconds(cfg, 8, prediction_delay=delay) - token_seconds(cfg, 8)
    assert 0 < slower <= delay + 1e-12
