from __future__ import annotations

from edgeroute.bench.policies import MEDIAN_PROMPT, full_queues
from policies.qos_drl import QoSDRL
from policies.types import RequestInfo


def test_full_queues_change_one_backend_per_view_as_the_gateway_does() -> None:
    """The decision benchmark's views are the gateway's kind: one backend's load moves
    per request and the snapshot keeps its epoch, so the filters' verdicts are kept
    (a fresh snapshot per request would time the filters on every decision)."""
    policy = QoSDRL()
    views = full_queues(policy, 12)
    assert len(views) == 24 and len({v.epoch for v in views}) == 1
    for before, after in zip(views, views[1:] + views[:1], strict=True):
        moved = [
            (a.requests[0].generated, b.requests[0].generated)
            for a, b in zip(after.backends, before.backends, strict=True)
            if a is not b
        ]
        assert len(moved) == 1 and moved[0][0] != moved[0][1]
    assert all(len(b.requests) == 10 and b.running == 5 for b in views[0].backends)
    assert len({b.expert for b in views[0].backends}) == min(12, len(policy.predictor.models))
    routing = policy.configured(30.0, shed=False)
    req = RequestInfo("m", 300, prompt=MEDIAN_PROMPT, now=1.0)
    ids = {b.id for b in views[0].backends}
    assert all(routing.decide(req, v).backend_id in ids for v in views)
