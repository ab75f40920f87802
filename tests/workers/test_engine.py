"""The scheduler, driven step by step without a clock."""

from __future__ import annotations

from workers.engine import Engine, Sequence
from workers.profiles import EngineProfile


def profile(**kw: object) -> EngineProfile:
    base: dict[str, object] = {
        "name": "t",
        "data_model": None,
        "base": 0.01,
        "k1": 0.001,
        "k2": 0.0001,
        "kv_blocks": 100,
        "block_size": 4,
    }
    base.update(kw)
    return EngineProfile(**base)  # type: ignore[arg-type]


def drain(engine: Engine, limit: int = 10_000) -> list[float]:
    """Run iterations until idle; returns each iteration's duration."""
    times = []
    now = 0.0
    for _ in range(limit):
        plan = engine.schedule()
        if plan.empty:
            break
        dt = engine.profile.iteration_time(plan.prefill_tokens, plan.decode_context)
        now += dt
        times.append(dt)
        engine.complete(plan, now)
    return times


def test_iteration_cost_is_base_plus_k1_prefill_plus_k2_decode_context() -> None:
    e = Engine(profile())
    a = Sequence("a", prompt_tokens=20, target_tokens=3)
    e.submit(a)
    times = drain(e)
    assert len(times) == 3
    assert times[0] == 0.01 + 0.001 * 20  # prefill, emits token 1
    assert times[1] == 0.01 + 0.0001 * 21  # decode with context 21
    assert times[2] == 0.01 + 0.0001 * 22
    assert a.generated == 3 and a.finished


def test_a_new_prefill_stalls_running_requests() -> None:
    e = Engine(profile())
    a = Sequence("a", prompt_tokens=10, target_tokens=10)
    e.submit(a)
    plan = e.schedule()
    e.complete(plan, 0.0)
    b = Sequence("b", prompt_tokens=50, target_tokens=2)
    e.submit(b)
    plan = e.schedule()
    assert plan.prefill == [b] and plan.decode == [a]
    # a's next token waits for b's whole prefill in the same iteration.
    assert e.profile.iteration_time(plan.prefill_tokens, plan.decode_context) == (
        0.01 + 0.001 * 50 + 0.0001 * 11
    )


def test_admission_blocks_on_memory_and_resumes_when_it_frees() -> None:
    e = Engine(profile(kv_blocks=10, block_size=4))
    a = Sequence("a", prompt_tokens=20, target_tokens=8)  # 6 blocks to start
    b = Sequence("b", prompt_tokens=20, target_tokens=2)
    e.submit(a)
    e.submit(b)
    plan = e.schedule()
    assert plan.prefill == [a] and list(e.waiting) == [b]
    drain(e)
    assert a.finished and b.finished
    assert b.admitted_at is not None
    assert e.free_blocks == 10


def test_preemption_recomputes_the_latest_request_when_memory_runs_out() -> None:
    e = Engine(profile(kv_blocks=12, block_size=4))
    a = Sequence("a", prompt_tokens=15, target_tokens=20)  # grows to 35 tokens: 9 blocks
    b = Sequence("b", prompt_tokens=11, target_tokens=10)  # grows to 21 tokens: 6 blocks
    e.submit(a)
    e.submit(b)
    drain(e)
    assert e.stats.preemptions >= 1
    assert b.preemptions >= 1 and a.preemptions == 0
    assert a.finished and b.finished
    assert a.generated == 20 and b.generated == 10
    assert e.free_blocks == 12


def test_prefix_cache_hit_shortens_prefill() -> None:
    e = Engine(profile(block_size=4))
    hashes = tuple(range(1, 6))  # 5 blocks = 20 tokens
    first = Sequence("a", prompt_tokens=22, target_tokens=1, prefix_hashes=hashes)
    e.submit(first)
    t_first = drain(e)[0]
    second = Sequence("b", prompt_tokens=22, target_tokens=1, prefix_hashes=hashes)
    e.submit(second)
    t_second = drain(e)[0]
    assert second.cached_tokens == 20
    assert t_second == 0.01 + 0.001 * 2 < t_first
    assert e.stats.prefix_hits == 20 and e.stats.prefix_queries == 44


def test_cancelled_requests_free_their_memory() -> None:
    e = Engine(profile())
    a = Sequence("a", prompt_tokens=40, target_tokens=100)
    e.submit(a)
    e.complete(e.schedule(), 0.0)
    assert e.free_blocks < 100
    e.cancel(a)
    assert e.schedule().empty
    assert e.free_blocks == 100 and not e.running


def test_a_request_larger_than_memory_is_refused_at_submission() -> None:
    e = Engine(profile(kv_blocks=4, block_size=4))
    try:
        e.submit(Sequence("a", prompt_tokens=10, target_tokens=10))
    except Exception as exc:
        assert "KV cache" in str(exc)
    else:
        raise AssertionError("expected a refusal")


def test_the_batch_holds_at_most_max_batch_and_the_rest_wait_their_turn() -> None:
    e = Engine(profile(max_batch=2))
    seqs = [Sequence(s, prompt_tokens=4, target_tokens=3) for s in "abc"]
    for s in seqs:
        e.submit(s)
    plan = e.schedule()
    assert plan.prefill == seqs[:2] and list(e.waiting) == seqs[2:]
    e.complete(plan, 0.0)
    plan = e.schedule()
    assert plan.decode == seqs[:2] and not plan.prefill  # still full: c waits
    e.complete(plan, 0.1)
    e.complete(e.schedule(), 0.2)  # a and b finish with their third token
    plan = e.schedule()
    assert plan.prefill == seqs[2:] and not e.waiting
