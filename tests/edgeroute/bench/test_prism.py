"""`bench prism`'s task mixes: what each server's activations are under each."""

from __future__ import annotations

import numpy as np
import pytest

from edgeroute.bench.prism import mix_distributions
from tests.support import DATA_DIR, needs_data
from workers.moe import MIXTRAL

pytestmark = needs_data("the MoE routing data")


def test_the_mixes_give_the_servers_their_own_a_shared_or_no_skew() -> None:
    own = mix_distributions("specialised", MIXTRAL, DATA_DIR)
    blended = mix_distributions("blended", MIXTRAL, DATA_DIR)
    flat = mix_distributions("uniform", MIXTRAL, DATA_DIR)
    assert len(own) == len(blended) == len(flat) == 3
    assert not np.allclose(own[0][0], own[1][0])  # each server its own task
    assert all(np.allclose(b[0], blended[0][0]) for b in blended)  # one blend for all
    assert np.allclose(blended[0][0], np.mean([d[0] for d in own], axis=0))
    assert np.allclose(flat[0][0], 1 / MIXTRAL.experts)
    for dists in (own, blended, flat):
        assert np.allclose(dists[0][0].sum(-1), 1.0)
    with pytest.raises(ValueError, match="unknown mix"):
        mix_distributions("mixed", MIXTRAL, DATA_DIR)
