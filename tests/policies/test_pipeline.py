"""Every policy on hand-built views: pure functions, so no servers needed."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, replace

import pytest
from pydantic import ValidationError

from policies import (
    BackendView,
    ClusterView,
    Decision,
    Pipeline,
    PipelineSpec,
    RequestInfo,
    build_pipeline,
)
from policies.filters import Healthy, ServesModel
from policies.pickers import Argmax, Random
from policies.plugins import PluginError
from policies.scorers import Load
from policies.text import block_hashes, stable_hash


def backend(i: int, **kw: object) -> BackendView:
    kw.setdefault("models", frozenset({"m"}))
    kw.setdefault("stats_age", 0.1)
    return BackendView(id=f"b{i}", id_hash=stable_hash(f"b{i}"), **kw)  # type: ignore[arg-type]


def view(*backends: BackendView) -> ClusterView:
    return ClusterView(tuple(backends), stale_after=5.0)


def req(**kw: object) -> RequestInfo:
    kw.setdefault("model", "m")
    kw.setdefault("prompt_tokens", 10)
    return RequestInfo(**kw)  # type: ignore[arg-type]


def decide(policy: str, v: ClusterView, r: RequestInfo, **spec: object) -> str:
    d = build_pipeline(PipelineSpec(policy=policy, **spec)).decide(r, v)  # type: ignore[arg-type]
    assert d.backend_id is not None, d.reason
    return d.backend_id


def test_round_robin_cycles_over_candidates_by_sequence_number() -> None:
    v = view(backend(0), backend(1), backend(2))
    picks = [decide("round_robin", v, req(seq=s)) for s in range(6)]
    assert picks == ["b0", "b1", "b2", "b0", "b1", "b2"]


def test_random_is_a_function_of_entropy_and_covers_all() -> None:
    v = view(backend(0), backend(1), backend(2))
    assert decide("random", v, req(entropy=7)) == decide("random", v, req(entropy=7))
    rng = random.Random(1)
    seen = Counter(decide("random", v, req(entropy=rng.getrandbits(63))) for _ in range(600))
    assert set(seen) == {"b0", "b1", "b2"} and min(seen.values()) > 150


def test_filters_drop_unhealthy_other_models_and_prefill_only() -> None:
    v = view(
        backend(0, healthy=False),
        backend(1, models=frozenset({"other"})),
        backend(2, role="prefill"),
        backend(3),
    )
    for e in range(20):
        assert decide("random", v, req(entropy=e)) == "b3"


def test_no_candidate_is_a_rejection_with_the_filter_named() -> None:
    d = build_pipeline(PipelineSpec(policy="least_load")).decide(
        req(), view(backend(0, healthy=False))
    )
    assert d.rejected and "healthy" in d.reason


def test_per_model_verdicts_are_remembered_per_snapshot_and_never_outlive_it() -> None:
    calls: list[str] = []

    @dataclass(frozen=True)
    class CountedHealthy(Healthy):
        def keep(self, req: RequestInfo, view: ClusterView, backend: BackendView) -> bool:
            calls.append(backend.id)
            return super().keep(req, view, backend)

    pipeline = Pipeline("counted", (CountedHealthy(), ServesModel()), (), Random())
    v = view(backend(0), backend(1, models=frozenset({"other"})), backend(2))
    for e in range(5):
        assert pipeline.decide(req(entropy=e), v).backend_id in ("b0", "b2")
    assert calls == ["b0", "b1", "b2"]  # worked out once for "m" in this snapshot
    # A snapshot that differs only in load carries the verdicts on...
    busier = v.with_load(tuple(replace(b, inflight=5) for b in v.backends))
    assert busier.epoch == v.epoch
    pipeline.decide(req(), busier)
    assert len(calls) == 3
    # ...while any other new snapshot starts afresh, so a backend's new health counts.
    sick = replace(v, backends=(backend(0, healthy=False), *v.backends[1:]))
    assert sick.epoch != v.epoch
    for e in range(20):
        assert decide("random", sick, req(entropy=e)) == "b2"
        assert pipeline.decide(req(entropy=e), sick).backend_id == "b2"
    assert len(calls) == 6
    assert decide("random", sick, req(model="other")) == "b1"
    none_left = replace(v, backends=(backend(0, healthy=False),))
    assert "healthy" in pipeline.decide(req(), none_left).reason


def test_least_load_counts_engine_queue_and_gateway_inflight() -> None:
    v = view(
        backend(0, running=3, waiting=2),  # engine says 5
        backend(1, inflight=4),  # gateway says 4 (across replicas)
        backend(2, running=1, inflight=6),
    )
    assert decide("least_load", v, req(entropy=0)) == "b1"


def test_least_load_ignores_stale_engine_stats() -> None:
    stale = backend(0, running=50, stats_age=60.0)
    fresh = backend(1, running=2)
    assert Load().score(req(), view(stale, fresh), [stale, fresh]) == [1.0, 1.0 / 3.0]
    assert decide("least_load", view(stale, fresh), req()) == "b0"


def test_near_equal_scores_are_broken_at_random() -> None:
    # Queues of 20 and 21 are within tie_epsilon: both must be picked.
    v = view(backend(0, inflight=20), backend(1, inflight=21), backend(2, inflight=1))
    v2 = view(backend(0, inflight=20), backend(1, inflight=21))
    picks = Counter(decide("least_load", v2, req(entropy=e)) for e in range(200))
    assert set(picks) == {"b0", "b1"}
    assert decide("least_load", v, req(entropy=3)) == "b2"


def test_power_of_two_picks_the_less_loaded_of_two_distinct_samples() -> None:
    v = view(backend(0, inflight=9), backend(1, inflight=0))
    assert all(decide("power_of_two", v, req(entropy=e)) == "b1" for e in range(50))
    v3 = view(backend(0, inflight=9), backend(1, inflight=5), backend(2, inflight=0))
    picks = Counter(decide("power_of_two", v3, req(entropy=e)) for e in range(300))
    assert picks["b0"] == 0  # the most loaded never wins a pair
    assert picks["b2"] > picks["b1"] > 0


def test_session_affinity_is_sticky_and_moves_only_the_removed_backends_sessions() -> None:
    backends = [backend(i) for i in range(5)]
    sessions = [stable_hash(f"user-{i}") for i in range(200)]
    before = {s: decide("session_affinity", view(*backends), req(session_hash=s)) for s in sessions}
    again = {s: decide("session_affinity", view(*backends), req(session_hash=s)) for s in sessions}
    assert before == again
    assert len(set(before.values())) == 5
    without_b2 = view(*[b for b in backends if b.id != "b2"])
    after = {s: decide("session_affinity", without_b2, req(session_hash=s)) for s in sessions}
    moved = [s for s in sessions if before[s] != after[s]]
    assert moved and all(before[s] == "b2" for s in moved)


def test_session_affinity_without_a_key_falls_back_to_load() -> None:
    v = view(backend(0, inflight=5), backend(1, inflight=0))
    assert decide("session_affinity", v, req(session_hash=None)) == "b1"


def test_prefix_cache_prefers_the_longest_cached_prefix() -> None:
    text = "x" * 256 * 8
    blocks = block_hashes(text, 64)
    assert len(blocks) == 8
    v = view(
        backend(0, cached_blocks=frozenset(blocks[:2])),
        backend(1, cached_blocks=frozenset(blocks[:6])),
        backend(2, cached_blocks=frozenset(blocks[1:])),  # no leading block: no prefix
    )
    assert decide("prefix_cache", v, req(block_hashes=blocks)) == "b1"


def test_cla_trades_cache_against_load() -> None:
    blocks = block_hashes("y" * 256 * 4, 64)
    r = req(block_hashes=blocks)
    idle = backend(1, inflight=0)  # cache 0, load score 1: 0.5 at equal weights
    # A full hit with one request queued: 0.5 + 0.5/2 = 0.75 beats idle.
    light = backend(0, cached_blocks=frozenset(blocks), inflight=1)
    assert decide("cla", view(light, idle), r) == "b0"
    # A quarter hit behind 30 requests: 0.125 + 0.5/31 loses to idle.
    busy = backend(0, cached_blocks=frozenset(blocks[:1]), inflight=30)
    assert decide("cla", view(busy, idle), r) == "b1"
    # Weighting load heavily flips the first case: 0.1 + 0.9/2 < 0.9.
    load_heavy = {"prefix_cache": 0.1, "load": 0.9}
    assert decide("cla", view(light, idle), r, scorers=load_heavy) == "b1"


def test_decisions_are_pure() -> None:
    v = view(*(backend(i, inflight=i % 3) for i in range(16)))
    r = req(entropy=12345, seq=9, session_hash=99)
    for policy in (
        "round_robin",
        "random",
        "least_load",
        "power_of_two",
        "session_affinity",
        "prefix_cache",
        "cla",
    ):
        assert len({decide(policy, v, r) for _ in range(5)}) == 1


@pytest.mark.parametrize(
    "bad",
    [
        {"policy": "nope"},
        {"scorers": {"nope": 1.0}},
        {"scorers": {"load": -1.0}},
        {"filters": ["nope"]},
        {"picker": "nope"},
        {"tie_epsilon": 2.0},
        {"unknown_field": 1},
    ],
)
def test_invalid_specs_are_rejected(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        PipelineSpec.model_validate(bad)


def test_memory_feasible_filter_skips_full_backends_only_when_fresh() -> None:
    spec = {"filters": ["healthy", "serves_model", "role", "memory_feasible"]}
    v = view(backend(0, kv_usage=0.99), backend(1, kv_usage=0.5, inflight=9))
    assert decide("least_load", v, req(), **spec) == "b1"
    v = view(backend(0, kv_usage=0.99, stats_age=99.0), backend(1, kv_usage=0.5, inflight=9))
    assert decide("least_load", v, req(), **spec) == "b0"


def test_queue_cap_skips_backends_as_deep_as_the_cap_and_sheds_when_every_one_is() -> None:
    """Depth is the gateway's in-flight count (every replica's), not the engine's
    scraped counts, which lag: an engine that says it is empty is still full."""
    cap = {"type": "queue_cap", "params": {"max_requests": 2}}
    spec = {"filters": ["healthy", "serves_model", "role", cap]}
    # Round-robin's sequence 0 takes the first candidate: b0 unless the cap skips it.
    v = view(backend(0, inflight=2, running=0, waiting=0), backend(1, inflight=1))
    assert decide("round_robin", v, req(seq=0)) == "b0"
    assert decide("round_robin", v, req(seq=0), **spec) == "b1"
    # an engine whose last scrape still shows requests that have since finished
    v = view(backend(0, inflight=1, running=4, waiting=3), backend(1, inflight=1))
    assert decide("round_robin", v, req(seq=0), **spec) == "b0"
    full = view(backend(0, inflight=2), backend(1, inflight=5))
    pipeline = build_pipeline(PipelineSpec(policy="round_robin", **spec))  # type: ignore[arg-type]
    d = pipeline.decide(req(seq=0), full)
    assert d.backend_id is None and d.reason == "no backend passed the 'queue_cap' filter"


@pytest.mark.parametrize("bad", [0, -3, 2.5, "4", True])
def test_queue_cap_refuses_a_cap_that_is_not_a_positive_whole_number(bad: object) -> None:
    cap = {"type": "queue_cap", "params": {"max_requests": bad}}
    spec = PipelineSpec(policy="least_load", filters=["healthy", cap])  # type: ignore[list-item]
    with pytest.raises(PluginError, match=r"filter 'queue_cap' refused .*max_requests"):
        build_pipeline(spec)


def test_a_choice_is_a_decision_with_the_default_fields() -> None:
    v = view(backend(0), backend(1, inflight=3))
    for policy in ("least_load", "cla", "round_robin", "power_of_two"):
        d = build_pipeline(PipelineSpec(policy=policy)).decide(req(entropy=5), v)
        assert isinstance(d, Decision) and not d.rejected
        assert d == Decision(d.backend_id)  # reason "", retry_after 1.0, no prediction


def test_a_choice_is_made_once_per_backend_and_kept_by_the_pipeline() -> None:
    pipeline = build_pipeline(PipelineSpec(policy="random"))
    v = view(backend(0), backend(1))
    first = {pipeline.decide(req(entropy=e), v).backend_id: e for e in range(2)}
    d0 = pipeline.decide(req(entropy=first["b0"]), v)
    assert d0 is pipeline.decide(req(entropy=first["b0"]), v)  # the same value, not a copy
    assert d0 is not pipeline.decide(req(entropy=first["b1"]), v)
    busier = v.with_load(tuple(replace(b, inflight=5) for b in v.backends))
    assert pipeline.decide(req(entropy=first["b0"]), busier) is d0
    # A rejection is not a choice: it is built each time, with its reason.
    none_left = view(backend(0, healthy=False))
    a, b = pipeline.decide(req(), none_left), pipeline.decide(req(), none_left)
    assert a.rejected and a == b and a is not b


def test_a_snapshot_is_plain_data() -> None:
    v = view(backend(0), backend(1))
    assert not hasattr(v, "__dict__")  # slots: the fields and nothing else
    assert v == replace(v) and v.with_load(v.backends) == v  # equal content, any epoch


def test_argmax_picks_at_random_among_the_scores_within_epsilon_of_the_best() -> None:
    rng = random.Random(7)
    candidates = [backend(i) for i in range(6)]
    picker = Argmax(tie_epsilon=0.05)
    for _ in range(2000):
        n = rng.randint(2, 6)
        # Few distinct values, so that ties, near-ties and all-tied lists all occur.
        scores = [rng.choice((0.0, 0.3, 0.5, 0.52, 0.56, 1.0)) for _ in range(n)]
        entropy = rng.getrandbits(63)
        near = [i for i, s in enumerate(scores) if s >= max(scores) - 0.05]
        expected = candidates[near[entropy % len(near)]]
        assert picker.pick(req(entropy=entropy), candidates[:n], scores) is expected, scores


@pytest.mark.parametrize("picker", ["argmax", "power_of_two"])
def test_score_pickers_without_scorers_take_every_candidate_as_equal(picker: str) -> None:
    v = view(backend(0, inflight=9), backend(1), backend(2, inflight=4))
    spec = {"scorers": {}, "picker": picker}
    picks = Counter(decide("least_load", v, req(entropy=e), **spec) for e in range(300))
    assert set(picks) == {"b0", "b1", "b2"}
    assert decide("least_load", v, req(entropy=7), **spec) == "b1"  # entropy 7 % 3


@pytest.mark.parametrize(
    "policy", ["least_load", "cla", "power_of_two", "round_robin", "random", "session_affinity"]
)
def test_the_ranking_starts_with_the_decision_and_holds_every_candidate_once(
    policy: str,
) -> None:
    pipeline = build_pipeline(PipelineSpec(policy=policy))
    v = view(
        backend(0, inflight=3),
        backend(1, healthy=False),
        backend(2, inflight=1),
        backend(3),
        backend(4, inflight=1),
    )
    for e in range(40):
        r = req(entropy=e * 7919, seq=e)
        ranking = pipeline.ranked(r, v)
        assert ranking[0] is pipeline.decide(r, v)
        assert sorted(d.backend_id or "" for d in ranking) == ["b0", "b2", "b3", "b4"]


def test_argmax_ranks_the_rest_best_first() -> None:
    pipeline = build_pipeline(PipelineSpec(policy="least_load"))
    v = view(backend(0, inflight=3), backend(1), backend(2, inflight=1), backend(3, inflight=7))
    assert [d.backend_id for d in pipeline.ranked(req(), v)] == ["b1", "b2", "b0", "b3"]


def test_a_rejection_is_the_whole_ranking() -> None:
    pipeline = build_pipeline(PipelineSpec(policy="least_load"))
    (only,) = pipeline.ranked(req(), view(backend(0, healthy=False)))
    assert only.rejected and "healthy" in only.reason
