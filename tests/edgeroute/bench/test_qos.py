"""`bench qos`: agents given by hand are results of their own."""

from __future__ import annotations

from pathlib import Path

from edgeroute.bench.qos import agents_named


def test_agents_given_by_hand_get_their_own_results_and_flags() -> None:
    assert agents_named("qos_routerdc", {}) == ("qos_routerdc", "")
    name, flags = agents_named(
        "qos_live", {"wide": [Path("a/full-s0"), Path("a/full-s1")], "my run!": [Path("b")]}
    )
    assert name == "qos_live_wide_my-run-"
    assert flags == " --model wide=a/full-s0,a/full-s1 --model my run!=b"
