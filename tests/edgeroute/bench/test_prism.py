"""`bench prism`'s task mixes: what each server's activations are under each."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgeroute.bench.prism import mix_sources
from edgeroute.sim.moe import Drawn, Replayed
from tests.support import DATA_DIR, needs_data
from workers.moe import DEEPSEEK_V2_LITE, MIXTRAL, real_sequences, task_distribution

pytestmark = needs_data("the MoE routing data")


def _dists(mix: str) -> list[np.ndarray]:
    sources = mix_sources(mix, MIXTRAL, DATA_DIR)
    assert sources is not None
    assert all(isinstance(s, Drawn) for s in sources)
    return [s.phases[0] for s in sources if isinstance(s, Drawn)]


def test_the_mixes_give_the_servers_their_own_a_shared_or_no_skew() -> None:
    own, blended, flat = _dists("specialised"), _dists("blended"), _dists("uniform")
    assert len(own) == len(blended) == len(flat) == 3
    assert not np.allclose(own[0], own[1])  # each server its own task
    assert all(np.allclose(b, blended[0]) for b in blended)  # one blend for all
    assert np.allclose(blended[0], np.mean(own, axis=0))
    assert np.allclose(flat[0], 1 / MIXTRAL.experts)
    for dists in (own, blended, flat):
        assert np.allclose(dists[0].sum(-1), 1.0)
    with pytest.raises(ValueError, match="unknown mix"):
        mix_sources("mixed", MIXTRAL, DATA_DIR)


def test_the_real_mix_replays_mixtrals_recorded_tokens_in_order() -> None:
    assert mix_sources("real", DEEPSEEK_V2_LITE, DATA_DIR) is None  # no such records
    sources = mix_sources("real", MIXTRAL, DATA_DIR)
    assert sources is not None and all(isinstance(s, Replayed) for s in sources)
    real = real_sequences(DATA_DIR)
    assert sum(len(s) for s in real["gsm8k"]) == 244  # tokens with all 32 layers
    assert sum(len(s) for s in real["humaneval"]) == 333
    tokens = sources[0].tokens(0.0, 20, np.random.default_rng(0))
    assert tokens.shape == (20, MIXTRAL.layers, MIXTRAL.top_k)
    # Consecutive tokens of one recorded GSM8K problem, not independent draws.
    seq = next(s for s in real["gsm8k"] if any((s == tokens[0]).all((1, 2))))
    at = int(np.flatnonzero((seq == tokens[0]).all((1, 2)))[0])
    assert (seq[(at + np.arange(20)) % len(seq)] == tokens).all()


def test_a_mix_file_blends_tasks_per_server_and_bad_files_are_refused(tmp_path: Path) -> None:
    good = tmp_path / "mix.json"
    good.write_text(json.dumps([{"taco": 1}, {"taco": 1, "wikitext": 1}, {"wikitext": 3}]))
    dists = [
        s.phases[0] for s in mix_sources(str(good), MIXTRAL, DATA_DIR) or [] if isinstance(s, Drawn)
    ]
    taco = task_distribution(MIXTRAL, "taco", DATA_DIR)
    wiki = task_distribution(MIXTRAL, "wikitext", DATA_DIR)
    assert len(dists) == 3
    assert np.allclose(dists[0], taco) and np.allclose(dists[2], wiki)
    assert np.allclose(dists[1], (taco + wiki) / 2)
    for bad in (
        [{"taco": 1}],
        [{"taco": -1}, {"a": 1}, {"b": 1}],
        [{}, {"a": 1}, {"b": 1}],
        {"x": 1},
    ):
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=r"bad\.json"):
            mix_sources(str(path), MIXTRAL, DATA_DIR)
