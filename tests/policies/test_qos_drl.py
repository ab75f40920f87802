"""The served QoS policy's predictor: one run per request, whatever the backends."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from policies.predictor import DEFAULT_MODEL_DIR, DEFAULT_PREDICTOR_DIR, MODEL_ROOT, ScorePredictor
from policies.qos_drl import QoSDRL
from policies.types import BackendView, ClusterView


def test_backends_sharing_a_model_share_one_prediction_row() -> None:
    predictor = ScorePredictor(MODEL_ROOT)  # RouterBench's: 11 models
    experts = [3, 1, 3, 0, 5, 1, 2, 4, 0, 6, 7, 3]
    for prompt in ("Write a function that sorts a list.", "word " * 400, ""):
        together = predictor.predict(prompt, experts)
        alone = [predictor.predict(prompt, [e])[0] for e in experts]
        assert together == alone
    assert predictor.predict("x", []) == []


def test_an_actor_uses_the_predictor_of_the_model_folder_its_run_is_in(tmp_path: Path) -> None:
    """A run in `<world>/runs/<run>/` trained with `<world>`'s predictor; the served
    default has its own beside it; a lone actor falls back to RouterDC's."""
    world = tmp_path / "world"
    run = world / "runs" / "full-s0"
    run.mkdir(parents=True)
    shutil.copy(MODEL_ROOT / "actor.onnx", run / "actor.onnx")
    routerbench = json.loads((MODEL_ROOT / "predictor.json").read_text())
    for name in ("predictor.onnx", "predictor.json"):
        shutil.copy(MODEL_ROOT / name, world / name)
    assert QoSDRL(run).predictor.models == routerbench["models"]
    attempt = world / "attempts" / "some-set" / "full-s0"  # deeper: still the world's
    shutil.copytree(run, attempt)
    assert QoSDRL(attempt).predictor.models == routerbench["models"]
    lone = tmp_path / "lone"
    lone.mkdir()
    shutil.copy(MODEL_ROOT / "actor.onnx", lone / "actor.onnx")
    served = QoSDRL().predictor
    assert served.folder == DEFAULT_MODEL_DIR.resolve()  # its own, beside it
    fallback = QoSDRL(lone).predictor
    assert fallback.folder == DEFAULT_PREDICTOR_DIR
    assert fallback.models == served.models != routerbench["models"]


def test_by_default_the_policy_is_the_agent_for_engines_and_never_sheds() -> None:
    """A spec naming no model serves `DEFAULT_MODEL_DIR`, the agent trained for engines
    that queue rather than refuse: on 200 random views, queues past any engine's
    batch included, it routes every request. RouterBench's agent, trained with the
    drop action on the paper's fleet of five-request batches, sheds most of them."""
    import numpy as np

    from policies import PipelineSpec, build_policy
    from policies.types import RequestInfo
    from tests.policies.test_qos_graph import random_view

    served = build_policy(PipelineSpec(policy="qos_drl"))
    assert isinstance(served, QoSDRL) and served.folder == DEFAULT_MODEL_DIR.resolve()
    shed = {}
    for policy in (served, QoSDRL(MODEL_ROOT)):
        rng = np.random.default_rng(0)
        decisions = [
            policy.decide(
                RequestInfo("m", int(rng.integers(1, 3000)), prompt="Sort a list.", now=100.0),
                random_view(rng, policy.predictor.models, int(rng.integers(1, 9)), 100.0),
            )
            for _ in range(200)
        ]
        shed[policy.folder] = sum(d.backend_id is None for d in decisions)
    assert shed[DEFAULT_MODEL_DIR.resolve()] == 0
    assert shed[MODEL_ROOT] > 100


def test_a_policy_for_another_target_shares_the_sessions_and_decides_as_a_new_one() -> None:
    from policies.types import BackendView, ClusterView, InflightRequest, RequestInfo

    prompt = "Write a python function to count the pairs in a list whose sum equals a target."
    base = QoSDRL(latency_ms=30.0)
    tight = base.configured(12.0)
    assert tight.latency == 0.012 and base.latency == 0.030
    assert tight._session is base._session and tight.predictor is base.predictor
    fresh = QoSDRL(latency_ms=12.0)
    assert tight._shed == fresh._shed != base._shed  # a shed carries its target
    experts = base.predictor.models
    view = ClusterView(
        tuple(
            BackendView(
                id=f"e{i}",
                models=frozenset({"m"}),
                expert=experts[i],
                running=i % 4,
                waiting=i % 3,
                kv_usage=0.1 * i,
                kv_capacity_tokens=4096,
                token_latency=0.004 * (i + 1),
                requests=tuple(InflightRequest(100, 0.0, 3 * i, 0.5, 90.0) for _ in range(i % 4)),
            )
            for i in range(6)
        )
    )
    for now in (1.0, 1.5, 3.0):
        req = RequestInfo("m", 300, prompt=prompt, now=now)
        assert tight.ranked(req, view) == fresh.ranked(req, view)
        assert base.ranked(req, view) == QoSDRL(latency_ms=30.0).ranked(req, view)
    # the two targets see the same state differently: the features are divided by L
    assert any(
        tight.ranked(RequestInfo("m", 300, prompt=p, now=2.0), view)
        != base.ranked(RequestInfo("m", 300, prompt=p, now=2.0), view)
        for p in (prompt, "Sort a list.", "word " * 50)
    )


def test_routes_naming_the_same_files_load_each_graph_once(tmp_path: Path) -> None:
    """The gateway builds one policy per route: specs that differ only in their target
    share the sessions; changed files and other folders get their own."""
    from policies import PipelineSpec, build_policy
    from policies.qos_drl import load

    folder = tmp_path / "model"
    folder.mkdir()
    for name in ("actor.onnx", "predictor.onnx", "predictor.json"):
        shutil.copy(MODEL_ROOT / name, folder / name)
    a = build_policy(PipelineSpec(policy="qos_drl", model=str(folder), latency_ms=30.0))
    b = build_policy(PipelineSpec(policy="qos_drl", model=str(folder), latency_ms=50.0))
    c = load(folder, 30.0)
    assert isinstance(a, QoSDRL) and isinstance(b, QoSDRL)
    assert a._session is b._session is c._session and a.predictor is b.predictor is c.predictor
    assert (a.latency, b.latency, c.latency) == (0.030, 0.050, 0.030)
    assert a._features is not b._features  # each route keeps its own feature cache

    lone = tmp_path / "lone"  # its own actor, and RouterDC's predictor, as the engines'
    lone.mkdir()
    shutil.copy(MODEL_ROOT / "actor.onnx", lone / "actor.onnx")
    d, engines = load(lone), load(MODEL_ROOT / "routerdc" / "engines")
    assert d._session is not a._session and d.predictor is engines.predictor is not a.predictor

    rewritten = (folder / "actor.onnx").read_bytes()  # new files, new sessions
    (folder / "actor.onnx").unlink()
    (folder / "actor.onnx").write_bytes(rewritten)
    os.utime(folder / "actor.onnx", ns=(1, 1))
    e = load(folder)
    assert e._session is not a._session and e.predictor is a.predictor

    (folder / "actor.onnx").unlink()  # missing files: the policy's own error, not a stale copy
    with pytest.raises(Exception, match=r"actor\.onnx"):
        load(folder)


def four_experts(policy: QoSDRL) -> ClusterView:
    """Four backends serving the predictor's first four models, 0-3 running."""
    experts = policy.predictor.models
    return ClusterView(
        tuple(
            BackendView(id=f"e{i}", models=frozenset({"m"}), expert=experts[i], running=i)
            for i in range(4)
        )
    )


def test_without_shedding_the_policy_takes_the_most_likely_backend() -> None:
    from policies.types import Decision, RequestInfo

    shedding = QoSDRL()
    serving = shedding.configured(30.0, shed=False)
    view = four_experts(shedding)
    req = RequestInfo("m", 300, prompt="Sort a list.", now=1.0)
    scored = shedding._scored(req, view)
    assert not isinstance(scored, Decision)
    logits = scored[2]
    logits[0] = logits.max() + 1.0  # as if the actor would drop it
    assert shedding._best(logits) == 0
    assert serving._best(logits) == 1 + int(logits[1:].argmax())
    chosen = serving.decide(req, view).backend_id
    assert chosen == serving.ranked(req, view)[0].backend_id == f"e{int(logits[1:].argmax())}"


def test_sampling_draws_each_action_as_often_as_the_actor_weighs_it() -> None:
    import numpy as np

    from policies.types import Decision, RequestInfo

    greedy = QoSDRL()
    view = four_experts(greedy)
    req = RequestInfo("m", 300, prompt="Sort a list.", now=1.0)
    scored = greedy._scored(req, view)
    assert not isinstance(scored, Decision)
    logits = scored[2]
    assert len(logits) == 1 + len(view.backends)
    logits[:] = np.log([0.1, 0.4, 0.3, 0.15, 0.05])  # drop, e0 .. e3
    sampling = greedy.configured(30.0, sample=True)
    draws = [sampling._best(logits, entropy) for entropy in range(20_000)]
    shares = np.bincount(draws, minlength=5) / len(draws)
    assert np.abs(shares - [0.1, 0.4, 0.3, 0.15, 0.05]).max() < 0.01
    assert all(greedy._best(logits, entropy) == 1 for entropy in range(100))
    # without shedding, the draw is among the backends only, in their own proportions
    unshed = greedy.configured(30.0, shed=False, sample=True)
    draws = [unshed._best(logits, entropy) for entropy in range(20_000)]
    shares = np.bincount(draws, minlength=5) / len(draws)
    assert shares[0] == 0
    assert np.abs(shares[1:] - np.array([0.4, 0.3, 0.15, 0.05]) / 0.9).max() < 0.01


def test_a_sampling_policy_decides_by_the_request_alone_and_ranks_its_draw_first() -> None:
    from policies.types import RequestInfo

    policy = QoSDRL().configured(30.0, shed=False, sample=True)
    view = four_experts(policy)
    chosen = set()
    for entropy in range(200):
        req = RequestInfo("m", 300, prompt="Sort a list.", now=1.0, entropy=entropy)
        decision = policy.decide(req, view)
        assert decision == policy.decide(req, view)  # the same request, the same draw
        ranked = [str(d.backend_id) for d in policy.ranked(req, view)]
        assert ranked[0] == decision.backend_id and sorted(ranked) == ["e0", "e1", "e2", "e3"]
        chosen.add(decision.backend_id)
    assert len(chosen) > 1  # it does draw


def test_with_no_candidate_the_policy_names_the_filter_that_left_none() -> None:
    from policies.types import BackendView, ClusterView, RequestInfo

    policy = QoSDRL()
    expert = policy.predictor.models[0]
    view = ClusterView(
        (
            BackendView(id="a", models=frozenset({"m"}), expert=expert, healthy=False),
            BackendView(id="b", models=frozenset({"other"}), expert=expert),
        )
    )
    req = RequestInfo("m", 10, prompt="hi", now=1.0)
    (rejected,) = policy.ranked(req, view)  # b is healthy but serves another model
    assert rejected.backend_id is None
    assert rejected.reason == "no backend passed the 'serves_model' filter"
    down = ClusterView((view.backends[0],))
    assert policy.decide(req, down).reason == "no backend passed the 'healthy' filter"


def test_a_route_s_filters_replace_the_default_ones_and_the_actor_scores_what_passes() -> None:
    """`filters:` on a qos_drl route is honoured, not ignored: with `queue_cap` the
    actor never picks a backend at the cap, and sheds, naming it, when all are."""
    from dataclasses import replace

    from policies import PipelineSpec, build_policy
    from policies.types import RequestInfo

    cap = {"type": "queue_cap", "params": {"max_requests": 2}}
    filters = ["healthy", "serves_model", "role", cap]
    capped = build_policy(PipelineSpec(policy="qos_drl", filters=filters))  # type: ignore[arg-type]
    plain = build_policy(PipelineSpec(policy="qos_drl", filters=[]))  # none: its own
    assert isinstance(capped, QoSDRL) and isinstance(plain, QoSDRL)
    view = four_experts(plain)
    req = RequestInfo("m", 300, prompt="Sort a list.", now=1.0)
    favourite = plain.configured(30.0, shed=False).decide(req, view).backend_id
    full = ClusterView(
        tuple(replace(b, inflight=2) if b.id == favourite else b for b in view.backends)
    )
    assert plain.configured(30.0, shed=False).decide(req, full).backend_id == favourite
    unshed = capped.configured(30.0, shed=False)
    assert unshed.decide(req, full).backend_id not in (None, favourite)
    ranked = [d.backend_id for d in unshed.ranked(req, full)]
    assert favourite not in ranked and len(ranked) == 3
    every = ClusterView(tuple(replace(b, inflight=5) for b in view.backends))
    assert capped.decide(req, every).reason == "no backend passed the 'queue_cap' filter"


def test_a_policy_plugin_refuses_stages_it_does_not_have() -> None:
    from pydantic import ValidationError

    from policies import PipelineSpec

    for stage in ({"scorers": {"load": 1.0}}, {"picker": "random"}, {"tie_epsilon": 0.1}):
        with pytest.raises(ValidationError, match="'qos_drl' is a policy plugin"):
            PipelineSpec(policy="qos_drl", **stage)


def test_warming_repeats_the_last_decision_and_changes_nothing() -> None:
    from policies import Pipeline, Warmable
    from policies.pickers import Argmax
    from policies.types import RequestInfo

    policy = QoSDRL()
    assert isinstance(policy, Warmable)
    assert not isinstance(Pipeline("p", (), (), Argmax()), Warmable)  # only those that can
    assert not policy.warm()  # no decision yet to repeat
    view = four_experts(policy)
    req = RequestInfo("m", 300, prompt="Sort a list.", now=1.0)
    before = policy.ranked(req, view)
    kept = (dict(policy._features), dict(policy._models))
    session, runs = policy._session, []

    class Counted:  # onnxruntime's session, its runs counted
        def run_with_iobinding(self, binding: Any) -> Any:
            runs.append(binding)
            return session.run_with_iobinding(binding)

    policy._session = Counted()
    assert policy.warm()
    (rows,) = policy._rows.values()
    assert runs == [rows.binding]
    assert rows.ids.tolist() == policy.predictor.prompt_ids(req.prompt).tolist()
    assert (dict(policy._features), dict(policy._models)) == kept
    assert policy.ranked(req, view) == before
    # another target's copy has not decided anything
    assert not policy.configured(40.0).warm()


def test_rows_kept_between_requests_decide_as_rows_built_anew() -> None:
    """A policy keeps each candidate set's rows and rewrites only the backends whose
    view changed: as views change one backend at a time, lose one to ill health and
    get it back, it decides to the last bit as a policy that never decided before."""
    import dataclasses

    import numpy as np

    from policies.types import Decision, InflightRequest, RequestInfo
    from tests.policies.test_qos_graph import random_view

    keeping = QoSDRL()
    rng = np.random.default_rng(3)
    view = random_view(rng, keeping.predictor.models, 8, 100.0)
    for step in range(40):
        now = 100.0 + 0.1 * step
        i = int(rng.integers(8))
        backends = list(view.backends)
        b = backends[i]
        if step % 10 == 9:  # ill, or well again
            backends[i] = dataclasses.replace(b, healthy=not b.healthy)
        else:
            more = InflightRequest(int(rng.integers(1, 900)), now, 0, 0.5, 100.0)
            backends[i] = b.with_load(b.inflight + 1, (*b.requests, more))
        if step % 10 == 9:  # a new configuration: a new view
            view = dataclasses.replace(view, backends=tuple(backends))
        else:
            view = view.with_load(tuple(backends))
        req = RequestInfo("m", 200, prompt="Sort a list of pairs.", now=now)
        fresh = QoSDRL(predictor=keeping.predictor)._scored(req, view)
        kept = keeping._scored(req, view)
        assert not isinstance(kept, Decision) and not isinstance(fresh, Decision)
        assert [b.id for b in kept[0]] == [b.id for b in fresh[0]]
        np.testing.assert_array_equal(kept[1], fresh[1])
        np.testing.assert_array_equal(kept[2], fresh[2])
    assert len(keeping._rows) >= 2  # sets of eight and of seven


def prior_logits(policy: QoSDRL, view: ClusterView) -> np.ndarray:
    """The actor's logits for one prompt at t = 1 s (the speed prior's tests)."""
    from policies.types import Decision, RequestInfo

    scored = policy._scored(RequestInfo("m", 300, prompt="Sort a list.", now=1.0), view)
    assert not isinstance(scored, Decision)
    return scored[2].copy()


def timed(view: ClusterView, seconds: tuple[float, ...]) -> ClusterView:
    """`view` with each backend's measured seconds per token (0: none yet)."""
    import dataclasses

    return dataclasses.replace(
        view,
        backends=tuple(
            dataclasses.replace(b, token_latency=s)
            for b, s in zip(view.backends, seconds, strict=True)
        ),
    )


def test_a_speed_prior_reads_unmeasured_backends_at_the_mean_measured_speed() -> None:
    """With `speed_prior` the actor sees a backend that has finished nothing yet as
    running at the mean speed of those that have, and nothing else changes; while
    none is measured, or all are, it sees what it sees without."""
    from policies.qos_state import ExpertSnapshot, with_speed_prior

    plain = QoSDRL()
    prior = plain.configured(30.0, speed_prior=True)

    cold = four_experts(plain)
    half = timed(cold, (0.020, 0.040, 0.0, 0.0))
    filled = timed(cold, (0.020, 0.040, 0.030, 0.030))
    assert np.array_equal(prior_logits(prior, half), prior_logits(plain, filled))
    assert not np.array_equal(prior_logits(plain, half), prior_logits(plain, filled))
    warm = timed(cold, (0.020, 0.040, 0.030, 0.025))
    for view in (cold, warm):
        assert np.array_equal(prior_logits(prior, view), prior_logits(plain, view))
    snaps = [ExpertSnapshot(0.0, np.zeros((2, 5, 9)), 0, 0, s) for s in (0.0, 0.0)]
    assert with_speed_prior(snaps) is snaps  # nothing measured: nothing to go by


def test_an_actor_trained_with_the_prior_is_always_served_with_it(tmp_path: Path) -> None:
    """The exported graph of an agent trained with `speed_prior` says so, and the policy
    then reads unmeasured backends at the mean whatever its route's `speed_prior`; the
    same weights exported plainly are served plainly."""
    from edgeroute.qos.config import read_record
    from edgeroute.qos.export import export_actor, load_actor

    run = DEFAULT_MODEL_DIR / "runs" / "full-s2"
    actor = load_actor(run / "actor.onnx", read_record(run)["config"])
    for name, prior in (("trained", True), ("plain", False)):
        (tmp_path / name).mkdir()
        export_actor(actor, tmp_path / name / "actor.onnx", speed_prior=prior)
    shipped = QoSDRL()
    trained = QoSDRL(tmp_path / "trained", predictor=shipped.predictor)
    plain = QoSDRL(tmp_path / "plain", predictor=shipped.predictor)
    assert trained.trained_with_prior and not plain.trained_with_prior
    assert not shipped.trained_with_prior
    assert trained.speed_prior and trained.configured(30.0, speed_prior=False).speed_prior
    assert not plain.speed_prior
    cold = four_experts(shipped)
    half, filled = timed(cold, (0.020, 0.040, 0.0, 0.0)), timed(cold, (0.020, 0.040, 0.030, 0.030))
    assert not np.array_equal(prior_logits(plain, half), prior_logits(plain, filled))
    for served in (trained, trained.configured(30.0, speed_prior=False)):
        assert np.array_equal(prior_logits(served, half), prior_logits(plain, filled))
    assert np.array_equal(
        prior_logits(plain.configured(30.0, speed_prior=True), half), prior_logits(plain, filled)
    )
