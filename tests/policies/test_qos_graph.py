"""The joined decision graph decides as its three steps do: the predictor's run,
`encode`, the actor's run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from policies.plugins import Need
from policies.predictor import DEFAULT_MODEL_DIR, MODEL_ROOT
from policies.qos_drl import QoSDRL
from policies.qos_state import INPUTS, encode, snapshot
from policies.types import BackendView, ClusterView, Decision, InflightRequest, RequestInfo

ATTEMPT = MODEL_ROOT / "routerdc" / "attempts" / "big-batch-scrape-nodrop-ep1000"
PROMPTS = (
    "Write a python function to count the pairs in a list whose sum equals a target.",
    "",  # no words at all
    "sort " * 700,
)


def random_view(rng: np.random.Generator, models: list[str], n: int, now: float) -> ClusterView:
    """N backends with anything a live view can hold: known and unknown models, named
    by expert or by served model, fresh and stale figures, queues past the rows kept,
    requests that started after the clock (a replica's clock ahead of ours)."""
    backends = []
    for i in range(n):
        kind = rng.integers(3)
        name = str(rng.choice(models)) if kind < 2 else f"stranger-{i}"
        requests = tuple(
            InflightRequest(
                int(rng.integers(1, 3000)),
                now - float(rng.uniform(-0.5, 20.0)),
                int(rng.integers(0, 60)),
                float(rng.uniform()),
                float(rng.uniform(0, 300)),
            )
            for _ in range(int(rng.integers(0, 14)))
        )
        backends.append(
            BackendView(
                id=f"b{i}",
                models=frozenset({"m", name}),
                expert=name if kind == 0 else None,
                running=int(rng.integers(0, 12)),
                waiting=int(rng.integers(0, 12)),
                kv_usage=float(rng.uniform()),
                kv_capacity_tokens=int(rng.choice([0, 4096, 40_000])),
                stats_age=float(rng.choice([0.0, 100.0])),
                max_batch=int(rng.integers(1, 9)),
                token_latency=float(rng.choice([0.0, rng.uniform(0, 0.5)])),
                inflight=len(requests),
                requests=requests,
            )
        )
    return ClusterView(tuple(backends))


@pytest.mark.parametrize(
    "folder",
    [
        DEFAULT_MODEL_DIR,
        MODEL_ROOT,
        ATTEMPT / "full-hs-s0",
        ATTEMPT / "dsa-s0",
        ATTEMPT / "baseline-s0",
    ],
    ids=["served by default", "routerbench", "full", "dsa", "baseline-rl"],
)
@pytest.mark.parametrize("latency_ms", [30.0, 12.0])
def test_the_joined_graph_decides_as_the_predictor_encode_and_the_actor(
    folder: Path, latency_ms: float
) -> None:
    decides_as_three_steps(QoSDRL(folder, latency_ms=latency_ms), folder / "actor.onnx")


@pytest.mark.parametrize("variant", ["full", "baseline"])
def test_an_actor_reading_the_load_is_fed_it_from_the_request(tmp_path: Path, variant: str) -> None:
    """An actor trained reading the load (`load_feature`) is joined with a `load` input
    and the policy then needs the request's arrival rate; one that does not read it
    needs nothing more. Both decide as their three steps do."""
    import torch

    from edgeroute.qos.export import export_actor
    from edgeroute.qos.model import QoSNet

    world = MODEL_ROOT / "routerdc"
    for load in (False, True):
        torch.manual_seed(1)
        run = tmp_path / str(load) / "runs" / f"{variant}-s0"
        run.mkdir(parents=True)
        for name in ("predictor.onnx", "predictor.json"):
            (run.parent.parent / name).write_bytes((world / name).read_bytes())
        net = QoSNet("experts" if variant == "baseline" else "han", 32, 2, 1, load=load)
        export_actor(net, run / "actor.onnx")
        policy = QoSDRL(run)
        assert (Need.ARRIVAL_RATE in policy.needs) == load
        decides_as_three_steps(policy, run / "actor.onnx")


def decides_as_three_steps(policy: QoSDRL, actor_path: Path) -> None:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    actor = ort.InferenceSession(str(actor_path), opts)
    names = {i.name for i in actor.get_inputs()}
    rng = np.random.default_rng(7)
    unknown = 0
    for case in range(60):
        now = 1000.0 + case
        view = random_view(rng, policy.predictor.models, int(rng.choice([1, 3, 12])), now)
        rate = float(rng.choice([0.0, rng.uniform(0, 50)]))
        req = RequestInfo(
            "m", int(rng.integers(1, 4000)), prompt=PROMPTS[case % 3], now=now, arrival_rate=rate
        )
        scored = policy._scored(req, view)
        assert not isinstance(scored, Decision), scored.reason
        candidates, preds, logits = scored
        expected = policy.predictor.predict_for(req.prompt, candidates)
        snaps = [snapshot(b, view.stale_after) for b in candidates]
        obs = encode(req.prompt_tokens, expected, snaps, policy.latency, now, arrival_rate=rate)
        reference = actor.run(["logits"], {k: obs[k][None] for k in INPUTS if k in names})
        if any(policy.predictor.expert_of(b) is None for b in candidates):
            unknown += 1  # the mean of all models, summed in another order: to the last bit
            np.testing.assert_allclose(preds, expected, rtol=1e-12)
            np.testing.assert_allclose(logits, reference[0][0], rtol=1e-5, atol=1e-6)
        else:
            assert preds.tolist() == [list(p) for p in expected]
            np.testing.assert_array_equal(logits, reference[0][0])
    assert 10 < unknown < 60  # both kinds of view were met


def test_a_decision_carries_the_prediction_for_the_backend_it_names() -> None:
    policy = QoSDRL(shed=False)
    rng = np.random.default_rng(3)
    view = random_view(rng, policy.predictor.models, 12, 50.0)
    req = RequestInfo("m", 300, prompt=PROMPTS[0], now=50.0)
    ranked = policy.ranked(req, view)
    assert len(ranked) == 12 and ranked[0] == policy.decide(req, view)
    by_id = {b.id: b for b in view.backends}
    for d in ranked:
        assert d.backend_id is not None and d.predicted is not None
        (alone,) = policy.predictor.predict_for(req.prompt, [by_id[d.backend_id]])
        assert d.predicted == pytest.approx(alone, rel=1e-12)


def test_an_actor_or_predictor_the_join_cannot_feed_is_refused_by_name(tmp_path: Path) -> None:
    """The hostile twins: an actor reading an input no served state has, and a file in
    the predictor's place that is not one. Each is refused when the policy loads,
    naming the file and what is wrong, rather than by onnxruntime in terms of the
    joined graph, which the operator never wrote."""
    import onnx
    from onnx import helper

    x = helper.make_tensor_value_info("clock_skew", onnx.TensorProto.FLOAT, [1, 6])
    y = helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, [1, 6])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["clock_skew"], ["logits"])], "g", [x], [y]
    )
    odd = tmp_path / "odd"
    odd.mkdir()
    onnx.save(helper.make_model(graph), str(odd / "actor.onnx"))
    with pytest.raises(ValueError, match=r"odd/actor\.onnx reads clock_skew"):
        QoSDRL(odd)
    world = tmp_path / "world"
    run = world / "runs" / "full-s0"
    run.mkdir(parents=True)
    (run / "actor.onnx").write_bytes((MODEL_ROOT / "actor.onnx").read_bytes())
    onnx.save(helper.make_model(graph), str(world / "predictor.onnx"))
    (world / "predictor.json").write_text((MODEL_ROOT / "predictor.json").read_text())
    with pytest.raises(ValueError, match=r"world/predictor\.onnx is not a predictor"):
        QoSDRL(run)


def test_every_shipped_graph_and_the_joined_one_are_written_at_the_pinned_ir() -> None:
    """onnx writes its own newest IR version by default, which an onnxruntime a release
    behind refuses ("Unsupported model IR version"): the shipped files and the graph
    the policy joins at load carry IR_VERSION, whatever onnx is installed."""
    import onnx

    from policies.onnx_nodes import IR_VERSION
    from policies.qos_graph import joined

    shipped = sorted(MODEL_ROOT.rglob("*.onnx"))
    assert len(shipped) > 100
    written = {f: onnx.load(str(f), load_external_data=False).ir_version for f in shipped}
    assert {f: v for f, v in written.items() if v != IR_VERSION} == {}
    graph = joined(MODEL_ROOT / "actor.onnx", MODEL_ROOT / "predictor.onnx")
    assert onnx.load_from_string(graph).ir_version == IR_VERSION
