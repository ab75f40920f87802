"""The decision histogram as `bench overhead` reads it from the gateway."""

from __future__ import annotations

from edgeroute.bench.overhead import DecisionHistogram
from gateway.metrics import DECISION


def test_the_budget_is_a_bucket_bound() -> None:
    assert 0.0003 in DECISION


def test_share_over_a_bound_is_exact_and_quantiles_interpolate() -> None:
    # 100 decisions: 90 within 200 us, 8 more within 300 us, 2 within 400 us.
    h = DecisionHistogram(
        total=0.02,
        count=100.0,
        buckets=((0.0002, 90.0), (0.0003, 98.0), (0.0004, 100.0), (float("inf"), 100.0)),
    )
    assert h.share_over(0.0003) == 0.02
    assert h.share_over(0.0002) == 0.10
    assert h.share_over(0.0004) == 0.0
    assert h.quantile(0.99) == 0.0003 + 0.0001 * (99 - 98) / 2
    later = DecisionHistogram(0.03, 150.0, tuple((le, n + 50.0) for le, n in h.buckets))
    assert later.since(h).count == 50.0 and later.since(h).share_over(0.0002) == 0.0


def test_a_gateway_that_cannot_start_says_why() -> None:
    """The hostile twin of a free port: one taken between being found free and the
    gateway binding it. The gateway exits, and the error carries its last words."""
    import socket

    import pytest

    from edgeroute.bench.overhead import ServerExited, start_gateway

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ServerExited, match=r"(?i)address already in use"):
            start_gateway(port, ["http://127.0.0.1:9"], "least_load")
