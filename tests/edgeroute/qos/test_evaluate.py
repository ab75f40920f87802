"""The simulator drives the policy the gateway serves, through the gateway's view, on
predictions the served predictor really makes and prompts no model trained on."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import onnxruntime as ort
import pytest

from edgeroute.qos.config import best_predicted
from edgeroute.qos.evaluate import evaluate, protective, queue_length, served
from edgeroute.sim.edge import (
    PREDICTOR_SHARE,
    EdgeEnv,
    EdgeExpert,
    Fleet,
    ServedPredictor,
    Task,
    cluster_view,
    default_experts,
    in_split,
    load_tasks,
    prompt_share,
)
from policies import PipelineSpec, build_pipeline
from policies.predictor import MODEL_ROOT
from policies.qos_drl import QoSDRL
from policies.qos_state import (
    FEATURE_CACHE_CAP,
    INPUTS,
    ExpertSnapshot,
    FeatureCache,
    encode,
    snapshot,
)
from policies.types import BackendView, ClusterView, Decision, InflightRequest, RequestInfo
from tests.support import DATA_DIR, needs_data

pytestmark = needs_data("the RouterBench quality data")


def test_the_three_splits_part_the_prompts_and_the_predictor_never_sees_the_others() -> None:
    everything = load_tasks(DATA_DIR)
    parts = {s: load_tasks(DATA_DIR, split=s) for s in ("predictor", "agent", "eval")}
    prompts = {s: {t.prompt for t in ts} for s, ts in parts.items()}
    assert sum(len(p) for p in prompts.values()) == len(everything)
    assert not prompts["predictor"] & (prompts["agent"] | prompts["eval"])
    assert not prompts["agent"] & prompts["eval"]
    assert all(prompt_share(p) < PREDICTOR_SHARE for p in prompts["eval"])
    assert len(prompts["eval"]) >= 40 and len(prompts["agent"]) >= 40
    assert not in_split(next(iter(prompts["eval"])), "agent")


# Engines that batch far more than the paper's five (vLLM's own regime).
BIG = Fleet(hardware_ms=(20.0, 40.0), running_cap=64, memory_tokens=40_000, waiting_cap=1000)


@pytest.mark.parametrize(
    ("latency_ms", "fleet", "rate"), [(30.0, Fleet(), 5.0), (20.0, Fleet(), 5.0), (30.0, BIG, 8.0)]
)
def test_the_served_policy_sees_exactly_the_features_the_agent_trained_on(
    latency_ms: float, fleet: Fleet, rate: float
) -> None:
    """The gateway's qos_drl, given the simulator as a ClusterView, ranks the experts
    as the actor does on the simulator's own features, decision by decision: at the
    default latency target and another, and on engines whose batches pass five (the
    served policy cuts each queue at the engine's own batch, as training does)."""
    policy = QoSDRL(MODEL_ROOT, latency_ms=latency_ms)
    env = EdgeEnv(
        default_experts(6, 0, fleet=fleet),
        load_tasks(DATA_DIR, split="eval"),
        rate=rate,
        latency_req=latency_ms / 1000,
        episode_len=200,
        predictor=ServedPredictor(policy.predictor),
    )
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    actor = ort.InferenceSession(str(MODEL_ROOT / "actor.onnx"), opts)
    names = {i.name for i in actor.get_inputs()}
    env.reset(3)
    done, i, busy, batch = False, 0, 0, 0
    while not done:
        obs = env.observe()
        logits = actor.run(["logits"], {k: obs[k][None] for k in INPUTS if k in names})[0][0]
        direct = int(np.argmax(logits))
        ranked = [d.backend_id for d in policy.ranked(*cluster_view(env, i))]
        order = np.argsort(-logits[1:], kind="stable").tolist()
        assert ranked == ([None] if direct == 0 else [f"e{n}" for n in order]), i
        busy += int(obs["queue_mask"].sum() > 0)
        batch = max(batch, *(len(e.running) for e in env.experts))
        _, done = env.step(direct)
        i += 1
    assert busy > 100  # the queues were not empty: the features were exercised
    assert batch > 5 if fleet.running_cap > 5 else batch <= 5


def test_a_policy_is_not_evaluated_at_a_latency_target_it_does_not_serve() -> None:
    """Its features are normalised by its own L: at another setting's it would judge
    every expert by the wrong target, so the simulator refuses to run it there."""
    env = EdgeEnv(default_experts(6, 0), load_tasks(DATA_DIR, split="eval"), latency_req=0.020)
    with pytest.raises(ValueError, match="targets L=30 ms, the setting 20"):
        evaluate(env, served(QoSDRL(MODEL_ROOT)), [1])
    assert evaluate(env, served(QoSDRL(MODEL_ROOT, latency_ms=20.0)), [1]).qos >= 0.0


def test_a_policy_that_sheds_is_a_drop_and_the_view_is_the_experts() -> None:
    class Shed:
        def decide(self, req: RequestInfo, view: ClusterView) -> Decision:
            assert req.prompt and req.prompt_tokens > 0
            assert [b.id for b in view.backends] == ["e0", "e1", "e2"]
            return Decision(None, reason="shed")

    env = EdgeEnv(default_experts(3, 0), load_tasks(DATA_DIR, split="eval"), episode_len=20)
    score = evaluate(env, served(Shed()), [1])
    assert score.drop_rate == 1.0 and score.qos == 0.0
    env.reset(1)
    env.step(1)
    env.step(1)
    _, view = cluster_view(env, 2)
    first = view.backends[0]
    assert first.inflight == first.running + first.waiting == 2
    assert first.kv_capacity_tokens == env.specs[0].memory_tokens


def queue_rows(snap: ExpertSnapshot, now: float) -> np.ndarray:
    """The actor's rows for one expert at `now`: [running, waiting] x 5, column 5 in
    seconds per token (L = 1 s)."""
    rows: np.ndarray = encode(0, [(0.0, 0.0)], [snap], 1.0, now)["queues"][0]
    return rows


def test_running_and_waiting_follow_the_engines_count_when_it_is_fresh() -> None:
    reqs = tuple(InflightRequest(100, float(t), 5) for t in range(7))
    b = BackendView(id="a", running=2, waiting=5, stats_age=0.5, requests=reqs)
    snap = snapshot(b, stale_after=5.0)
    assert (snap.running, snap.waiting) == (2, 5)
    running = queue_rows(snap, now=10.0)[0]
    assert np.array_equal(
        running[:, 5], np.array([2.0, 1.8, 0, 0, 0], np.float32)
    )  # the oldest two
    unknown = BackendView(id="a", running=2, max_batch=5, requests=reqs)  # never scraped
    stale = snapshot(unknown, stale_after=5.0)
    assert (stale.running, stale.waiting) == (5, 2)  # no figures: cut at its batch cap
    big = snapshot(BackendView(id="a", running=2, max_batch=256, requests=reqs), 5.0)
    assert (big.running, big.waiting) == (7, 0)  # a big engine would run them all


def test_a_big_engines_running_batch_is_its_own_not_the_papers() -> None:
    """An engine reporting 12 running of 15 in flight: its batch is 12, whatever the
    paper's edge experts (5) would run, so the rows past the 12th are the waiting ones."""
    reqs = tuple(InflightRequest(100, float(t), 5) for t in range(15))
    b = BackendView(id="a", running=12, waiting=3, max_batch=256, stats_age=0.0, requests=reqs)
    snap = snapshot(b, stale_after=5.0)
    assert (snap.running, snap.waiting) == (12, 3)
    waiting = queue_rows(snap, now=20.0)[1]
    # the waiting rows are the 13th-15th oldest (started at 12, 13, 14 s)
    assert np.array_equal(waiting[:, 5], np.array([1.6, 1.4, 1.2, 0, 0], np.float32))


def test_cached_features_follow_the_clock_and_a_rebuilt_view() -> None:
    """A backend's snapshot is kept while its view is the same; its latency still moves
    with the clock, and a rebuilt view (new progress, new memory use) replaces it."""
    reqs = tuple(InflightRequest(100, float(t), 5) for t in range(3))
    b = BackendView(id="a", running=3, stats_age=0.0, kv_usage=0.1, requests=reqs)
    cache: FeatureCache = {}
    first = snapshot(b, stale_after=5.0, cache=cache)
    assert snapshot(b, stale_after=5.0, cache=cache) is first
    assert queue_rows(first, now=20.0)[0, 0, 5] == 4.0
    assert queue_rows(first, now=10.0)[0, 0, 5] == 2.0
    fuller = replace(b, kv_usage=0.7)  # rebuilt, the same requests: rows kept
    again = snapshot(fuller, stale_after=5.0, cache=cache)
    assert again.memory == 0.7 and again.packed is first.packed
    moved = replace(b, requests=tuple(InflightRequest(100, float(t), 10) for t in range(3)))
    cached = queue_rows(snapshot(moved, stale_after=5.0, cache=cache), now=20.0)
    assert cached[0, 0, 4] == np.float32(10 / 300)
    assert np.array_equal(queue_rows(snapshot(moved, stale_after=5.0), now=20.0), cached)


def test_the_feature_cache_does_not_keep_backends_that_are_gone() -> None:
    """A long-lived policy sees backends come and go under new ids: its cache is
    bounded, and the backends still served are cached again after it starts over."""
    cache: FeatureCache = {}
    for i in range(3 * FEATURE_CACHE_CAP):
        snapshot(BackendView(id=f"pod-{i}", stats_age=0.0), stale_after=5.0, cache=cache)
        assert len(cache) <= FEATURE_CACHE_CAP
    b = BackendView(id="stays", stats_age=0.0)
    first = snapshot(b, stale_after=5.0, cache=cache)
    assert snapshot(b, stale_after=5.0, cache=cache) is first


def test_br_is_the_gateways_preset_and_breaks_ties_at_random() -> None:
    """BR in the simulator is the gateway's `best_predicted` with the world's predictor:
    each request goes to an expert of the best predicted score, and among tied ones
    to any of them (the first one of the list would favour one hardware draw)."""
    policy = QoSDRL(MODEL_ROOT)
    env = EdgeEnv(
        default_experts(6, 0),
        load_tasks(DATA_DIR, split="eval"),
        episode_len=100,
        predictor=ServedPredictor(policy.predictor),
    )
    br = served(build_pipeline(PipelineSpec(**best_predicted("routerbench"))))
    env.reset(2)
    done, i, tied_picks = False, 0, set()
    while not done:
        scores = [s for s, _ in env.preds]
        best = [n for n, s in enumerate(scores) if s == max(scores)]
        action = br(env, i)
        assert action - 1 in best, i
        if len(best) > 1:
            tied_picks.add((tuple(best), action - 1))
        _, done = env.step(action)
        i += 1
    assert len({n for _, n in tied_picks}) > 1


class _Says:
    """Predicts model "b" answers better, and every answer 20 tokens long."""

    def predict(self, task: Task, model: str, rng: random.Random) -> tuple[float, float]:
        return (0.9 if model == "b" else 0.5), 20.0


def test_the_protective_rule_keeps_its_cap_on_the_experts_that_meet_l_and_dumps_the_rest() -> None:
    """Two experts that meet L alone (a, and b predicted better) and one that cannot (c,
    the slowest): b takes what it has room for, then a, and once both hold their cap
    every arrival goes to c; at a light load everything goes to b."""
    fast_a = EdgeExpert("a", base=0.012, k1=0.0001, k2=0.00002, memory_tokens=20_000)
    fast_b = replace(fast_a, model="b")
    slow = EdgeExpert("c", base=0.05, k1=0.0001, k2=0.00002, memory_tokens=20_000)
    task = Task("p", 100, {"a": 0.5, "b": 0.9, "c": 0.9}, {"a": 20, "b": 20, "c": 20})
    rule = protective(2)
    for rate, loaded in ((200.0, True), (0.5, False)):
        env = EdgeEnv(
            [fast_a, fast_b, slow], [task], rate=rate, seed=1, episode_len=40, predictor=_Says()
        )
        env.reset(1)
        chosen = []
        for i in range(40):
            queues = [queue_length(env, n) for n in range(3)]
            action = rule(env, i)
            if queues[1] < 2:
                assert action == 2
            elif queues[0] < 2:
                assert action == 1
            else:
                assert action == 3
            chosen.append(action)
            env.step(action)
        assert (3 in chosen) == loaded and 2 in chosen
        if not loaded:
            assert set(chosen) == {2}
