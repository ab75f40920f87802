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


def exits_saying(code: int, *lines: str) -> list[str]:
    """A server that never listens: it writes `lines` to stderr and exits with `code`."""
    import sys

    script = "import sys; sys.stderr.write(sys.argv[1]); sys.exit(int(sys.argv[2]))"
    return [sys.executable, "-c", script, "".join(f"{x}\n" for x in lines), str(code)]


def test_a_server_that_exits_before_it_answers_is_quoted_by_its_last_lines() -> None:
    import subprocess
    import tempfile

    import pytest

    from edgeroute.bench.overhead import ServerExited, wait_ready

    lines = [f"line {i}" for i in range(8)]
    with tempfile.TemporaryFile() as said:
        proc = subprocess.Popen(exits_saying(4, *lines), stderr=said)
        with pytest.raises(ServerExited) as exc:
            wait_ready("http://127.0.0.1:9/health", 60.0, proc, said)
    assert str(exc.value).endswith("exited with 4: line 3 | line 4 | line 5 | line 6 | line 7")


def test_a_server_that_exits_silently_is_said_to() -> None:
    import subprocess
    import tempfile

    import pytest

    from edgeroute.bench.overhead import ServerExited, wait_ready

    with tempfile.TemporaryFile() as said:
        proc = subprocess.Popen(exits_saying(5), stderr=said)
        with pytest.raises(ServerExited, match=r"exited with 5: it wrote nothing$"):
            wait_ready("http://127.0.0.1:9/health", 60.0, proc, said)
    # without the file, the exit alone
    proc = subprocess.Popen(exits_saying(6, "unheard"), stderr=subprocess.DEVNULL)
    with pytest.raises(ServerExited, match=r"exited with 6$"):
        wait_ready("http://127.0.0.1:9/health", 60.0, proc)
