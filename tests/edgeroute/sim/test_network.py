"""The network model validated as the NetKV paper's section VI-B does."""

from __future__ import annotations

import pytest

from edgeroute.sim.network import Network


def run_until_idle(net: Network) -> dict[object, float]:
    finished = {}
    while net.flows:
        for f in net.advance(net.next_completion()):
            finished[f.tag] = net.now
    return finished


def test_a_lone_flow_gets_its_tier_bandwidth_within_01_percent() -> None:
    net = Network()
    up, core, down = net.add_link(12.5e9 / 8), net.add_link(50e9 / 8), net.add_link(100e9 / 8)
    flow = net.add_flow([up, core, down], 1e9, "f")
    assert flow.rate == pytest.approx(12.5e9 / 8, rel=1e-3)
    assert run_until_idle(net)["f"] == pytest.approx(1e9 / (12.5e9 / 8), rel=1e-3)


@pytest.mark.parametrize("n", [2, 3, 8])
def test_n_flows_on_one_bottleneck_each_get_one_nth(n: int) -> None:
    net = Network()
    shared = net.add_link(10e9)
    flows = [net.add_flow([shared, net.add_link(1e12)], 1e9, i) for i in range(n)]
    assert all(f.rate == pytest.approx(10e9 / n) for f in flows)


def test_max_min_gives_the_unbottlenecked_flow_the_leftover() -> None:
    net = Network()
    a, b = net.add_link(10.0), net.add_link(4.0)
    f1 = net.add_flow([a], 100, 1)  # only on a
    f2 = net.add_flow([a, b], 100, 2)  # limited to 4 by b
    assert f2.rate == pytest.approx(4.0) and f1.rate == pytest.approx(6.0)


def test_reallocation_after_a_flow_completes() -> None:
    net = Network()
    link = net.add_link(100.0)
    net.add_flow([link], 100.0, "short")
    long = net.add_flow([link], 300.0, "long")
    assert long.rate == pytest.approx(50.0)
    done = run_until_idle(net)
    # Both at 50 until t=2 (short done, long has 200 left), then long alone at 100.
    assert done["short"] == pytest.approx(2.0)
    assert done["long"] == pytest.approx(4.0)
