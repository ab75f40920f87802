from __future__ import annotations

from pathlib import Path

import numpy as np

from policies.prism import entropy
from tests.support import DATA_DIR, needs_data
from workers.moe import (
    DEEPSEEK_V2_LITE,
    MIXTRAL,
    activation_counts,
    read_counts,
    sample_token,
    task_distribution,
)

pytestmark = needs_data("the MoE routing data")


def test_measured_tasks_reproduce_the_real_selection_frequencies() -> None:
    counts = read_counts(Path(DATA_DIR))
    assert set(counts) == {"gsm8k", "humaneval"} and counts["gsm8k"].shape == (32, 8)
    dist = task_distribution(MIXTRAL, "gsm8k", Path(DATA_DIR))
    sim = activation_counts(dist, 2, 3000, np.random.default_rng(0))
    real = counts["gsm8k"] / counts["gsm8k"].sum(-1, keepdims=True)
    # Layer 2's hottest expert (4: 116 of 494 selections) stays the hottest.
    assert int(np.argmax(sim[2])) == int(np.argmax(real[2])) == 4
    assert np.abs(sim / sim.sum(-1, keepdims=True) - real).max() < 0.05


def test_other_tasks_keep_the_skew_but_prefer_other_experts() -> None:
    a = task_distribution(MIXTRAL, "bigbench-arithmetic", Path(DATA_DIR))
    b = task_distribution(MIXTRAL, "bigbench-ascii", Path(DATA_DIR))
    real = task_distribution(MIXTRAL, "gsm8k", Path(DATA_DIR))
    measured = [task_distribution(MIXTRAL, t, Path(DATA_DIR)) for t in ("gsm8k", "humaneval")]
    # Relabelling experts keeps each layer's measured entropy exactly.
    assert any(np.allclose(entropy(a), entropy(m)) for m in measured)
    assert abs(entropy(a).mean() - entropy(real).mean()) < 0.05
    assert (np.argmax(a, -1) != np.argmax(b, -1)).mean() > 0.4


def test_deepseek_shape_matches_the_measured_entropy() -> None:
    d = task_distribution(DEEPSEEK_V2_LITE, "mmlu", Path(DATA_DIR))
    assert d.shape == (26, 64)
    real = task_distribution(MIXTRAL, "humaneval", Path(DATA_DIR))
    assert abs(entropy(d).mean() - entropy(real).mean()) < 0.03
    sel = sample_token(d, 6, np.random.default_rng(1))
    assert sel.shape == (26, 6) and all(len(set(r)) == 6 for r in sel.tolist())
