from __future__ import annotations

import pytest
from pydantic import ValidationError

from oracle.topology import TierPair, Topology

LABELS = {
    "a": {"node": "n0", "rack": "r0", "pod": "p0"},
    "b": {"node": "n0", "rack": "r0", "pod": "p0"},
    "c": {"node": "n1", "rack": "r0", "pod": "p0"},
    "d": {"node": "n2", "rack": "r1", "pod": "p0"},
    "e": {"node": "n3", "rack": "r2", "pod": "p1"},
}


def test_tiers_derive_from_locality_labels_and_pair_overrides() -> None:
    t = Topology(instances=LABELS, tier_map=[TierPair(a="a", b="e", tier="rack")])
    assert t.tier("a", "b") == "node"
    assert t.tier("a", "c") == "rack"
    assert t.tier("a", "d") == "pod"
    assert t.tier("c", "e") == "cluster"
    assert t.tier("e", "a") == "rack"


def test_transfer_time_is_latency_plus_bytes_over_effective_bandwidth() -> None:
    t = Topology(instances=LABELS, congestion={"rack": 0.5})
    gbps, lat_us = t.tier_bandwidth["rack"], t.tier_latency["rack"]
    nbytes = 1e9
    expect = lat_us * 1e-6 + nbytes / (gbps * 1e9 / 8 * 0.5 / 3)
    assert t.transfer_seconds("a", "c", nbytes, self_contention=2) == pytest.approx(expect)


@pytest.mark.parametrize(
    "bad",
    [
        {"congestion": {"rack": 1.0}},
        {"congestion": {"rack": -0.1}},
        {"congestion": {"rack": float("nan")}},
        {"tier_bandwidth": {"rack": -5.0}},
        {"congestion": {"nope": 0.1}},
        {"instances": LABELS, "tier_map": [{"a": "a", "b": "zz", "tier": "rack"}]},
    ],
)
def test_invalid_topologies_are_rejected(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        Topology.model_validate(bad)
