"""In-flight progress: streamed requests count their events; whole-answer requests
take their share of the engine's generation counter."""

from __future__ import annotations

from gateway.backends import BackendPool, InflightEntry
from gateway.settings import BackendConfig, CircuitConfig


def pool_with(running: int) -> tuple[BackendPool, list[InflightEntry]]:
    pool = BackendPool(CircuitConfig(), stale_after=5.0, prefix_entries=16)
    pool.track_requests = True
    pool.set_configs([BackendConfig(url="http://127.0.0.1:1", id="a")])
    b = pool.get("a")
    assert b is not None
    b.stats.running = running
    entries = [
        InflightEntry(10, 0.0, streamed=False),
        InflightEntry(10, 0.0, streamed=False),
        InflightEntry(10, 0.0, streamed=True),
    ]
    for e in entries:
        pool.dispatched(b, (), e)
    return pool, entries


def test_engine_tokens_are_shared_among_its_running_requests() -> None:
    pool, (a, b, streamed) = pool_with(running=4)  # one running request is not ours
    backend = pool.get("a")
    assert backend is not None
    pool.engine_generated(backend, 10)
    assert (a.generated, b.generated) == (2, 2)  # 2.5 each, whole tokens shown
    pool.engine_generated(backend, 10)
    assert (a.generated, b.generated) == (5, 5)  # fractions are kept, not lost
    assert streamed.generated == 0  # its events count it, not the engine
    pool.rebuild()
    shown = sorted(r.generated for r in pool.view.backends[0].requests)
    assert shown == [0, 5, 5]


def test_an_engine_that_reports_no_running_requests_cannot_overcredit() -> None:
    pool, (a, b, _) = pool_with(running=0)  # a stale or lying figure
    backend = pool.get("a")
    assert backend is not None
    pool.engine_generated(backend, 9)
    assert a.generated + b.generated <= 9  # split over the requests we know of


def test_a_backends_seconds_per_token_follow_its_finished_requests() -> None:
    pool, _ = pool_with(running=1)
    b = pool.get("a")
    assert b is not None
    pool.rebuild()
    assert pool.view.backends[0].token_latency == 0.0  # nothing finished yet
    pool.finished_tokens(b, 2.0, 100)
    assert b.token_latency == 0.02  # the first request sets it
    pool.finished_tokens(b, 6.0, 100)
    assert b.token_latency == 0.8 * 0.02 + 0.2 * 0.06  # then a moving average
    pool.finished_tokens(b, 5.0, 0)  # an answer without tokens says nothing of speed
    pool.finished_tokens(b, -1.0, 10)  # nor does a clock that went backwards
    assert b.token_latency == 0.8 * 0.02 + 0.2 * 0.06
    pool.rebuild()
    assert pool.view.backends[0].token_latency == b.token_latency
