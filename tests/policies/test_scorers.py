"""The queue and KV-utilisation scorers (llm-d's default profile re-creates with them)."""

from __future__ import annotations

from policies import BackendView, ClusterView, RequestInfo
from policies.scorers import KVUtilization, Queue

REQ = RequestInfo(model="m", prompt_tokens=10)


def view(*backends: BackendView) -> ClusterView:
    return ClusterView(tuple(backends))


def test_queue_is_min_max_scaled_and_level_queues_all_score_one() -> None:
    a = BackendView("a", waiting=0, stats_age=0.0)
    b = BackendView("b", waiting=4, stats_age=0.0)
    c = BackendView("c", waiting=2, stats_age=0.0)
    v = view(a, b, c)
    assert Queue().score(REQ, v, v.backends) == [1.0, 0.0, 0.5]
    level = view(a, BackendView("d", waiting=0, stats_age=0.0))
    assert Queue().score(REQ, level, level.backends) == [1.0, 1.0]
    # Stale engine stats: the gateway's own in-flight count stands in.
    stale = view(BackendView("e", waiting=0, inflight=3), BackendView("f", waiting=9, inflight=1))
    assert Queue().score(REQ, stale, stale.backends) == [0.0, 1.0]


def test_kv_utilization_prefers_free_memory_and_ignores_stale_stats() -> None:
    full = BackendView("full", kv_usage=0.9, stats_age=0.0)
    empty = BackendView("empty", kv_usage=0.1, stats_age=0.0)
    unknown = BackendView("unknown", kv_usage=0.0)  # never scraped
    v = view(full, empty, unknown)
    scores = KVUtilization().score(REQ, v, v.backends)
    assert scores[1] > scores[0] and scores[2] == 0.0
