from __future__ import annotations

import pytest
from pydantic import ValidationError

from oracle.state import LinkSample, OracleState
from oracle.topology import Topology


def test_updates_validate_and_a_rejected_one_changes_nothing() -> None:
    s0 = OracleState(topology=Topology())
    s1 = s0.with_congestion({"rack": 0.3})
    assert s1.topology.congestion == {"rack": 0.3}
    for bad in ({"rack": 1.0}, {"rack": -0.2}, {"nope": 0.1}, {"rack": float("nan")}):
        with pytest.raises(ValidationError):
            s1.with_congestion(bad)
    assert s1.topology.congestion == {"rack": 0.3}
    with pytest.raises(ValidationError):
        s1.with_topology({"tier_bandwidth": {"rack": -1.0}})


def test_links_aggregate_to_capacity_weighted_rho() -> None:
    s = OracleState().with_links(
        [
            LinkSample(tier="pod", utilisation=0.2, capacity_gbps=100),
            LinkSample(tier="pod", utilisation=0.8, capacity_gbps=300),
            LinkSample(tier="cluster", utilisation=1.0),
        ]
    )
    assert s.topology.congestion["pod"] == pytest.approx(0.65)
    assert s.topology.congestion["cluster"] == 0.99
    with pytest.raises(ValidationError):
        LinkSample(tier="pod", utilisation=1.5)


def test_topology_change_keeps_congestion_of_surviving_tiers() -> None:
    s = OracleState().with_congestion({"rack": 0.3, "pod": 0.5})
    s2 = s.with_topology(
        {
            "tier_bandwidth": {"rack": 100.0, "cluster": 10.0},
            "tier_latency": {"rack": 5.0, "cluster": 20.0},
        }
    )
    assert s2.topology.congestion == {"rack": 0.3}


def test_describe_reports_age_and_staleness_tolerance() -> None:
    topo = {
        "tier_bandwidth": {"rack": 50.0, "cluster": 12.5},
        "tier_latency": {"rack": 5.0, "cluster": 20.0},
    }
    s = OracleState().with_topology(topo).with_congestion({"rack": 0.3, "cluster": 0.3})
    d = s.describe()
    assert d["staleness_tolerance"]["rack>cluster"] == pytest.approx(0.42)
    assert 0 <= d["age_s"] < 1
