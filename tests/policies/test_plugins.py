"""The plugin registry: types by name, factories with parameters, declared needs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from pydantic import ValidationError

from policies import (
    BackendView,
    ClusterView,
    Need,
    PipelineSpec,
    PluginError,
    Registry,
    RequestInfo,
    build_pipeline,
    build_policy,
)
from policies.builtin import register_builtins
from policies.filters import MemoryFeasible
from policies.pickers import Argmax
from policies.plugins import from_dataclass
from policies.scorers import Load


def builtins() -> Registry:
    r = Registry()
    register_builtins(r)
    return r


def test_a_stage_takes_its_parameters_from_the_spec() -> None:
    spec = PipelineSpec(
        policy="least_load",
        filters=["healthy", {"type": "memory_feasible", "params": {"max_kv_usage": 0.5}}],  # type: ignore[list-item]
        picker={"type": "argmax", "params": {"tie_epsilon": 0.2}},  # type: ignore[arg-type]
    )
    p = build_pipeline(spec)
    assert p.filters[1] == MemoryFeasible(max_kv_usage=0.5)
    assert p.picker == Argmax(tie_epsilon=0.2)
    assert [s for s, _ in p.scorers] == [Load()]


def test_the_mapping_form_and_the_list_form_of_scorers_build_the_same_pipeline() -> None:
    a = build_pipeline(PipelineSpec(policy="cla", scorers={"prefix_cache": 0.7, "load": 0.3}))
    b = build_pipeline(
        PipelineSpec(
            policy="cla",
            scorers=[{"type": "prefix_cache", "weight": 0.7}, {"type": "load", "weight": 0.3}],  # type: ignore[list-item]
        )
    )
    assert a.scorers == b.scorers and a.filters == b.filters and a.picker == b.picker


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"policy": "nope"}, "unknown policy 'nope'"),
        ({"scorers": {"nope": 1.0}}, "unknown scorer 'nope'"),
        ({"filters": [{"type": "nope"}]}, "unknown filter 'nope'"),
        ({"picker": "nope"}, "unknown picker 'nope'"),
        ({"policy": "cla", "params": {"x": 1}}, "pipeline preset"),
        ({"scorers": [{"type": "load", "weight": -1}]}, "greater than or equal to 0"),
        ({"scorers": [{"type": "load", "extra": 1}]}, "extra"),
    ],
)
def test_a_spec_naming_what_is_not_registered_is_refused(
    spec: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        PipelineSpec.model_validate(spec)


def test_a_factory_refuses_parameters_it_does_not_take() -> None:
    spec = PipelineSpec(
        filters=[{"type": "memory_feasible", "params": {"max_kv": 0.5}}]  # type: ignore[list-item]
    )
    with pytest.raises(PluginError, match=r"filter 'memory_feasible'.*unknown parameters"):
        build_pipeline(spec)
    spec = PipelineSpec(scorers=[{"type": "netkv_full", "params": {"x": 1}}])  # type: ignore[list-item]
    with pytest.raises(PluginError, match="netkv_full"):
        build_pipeline(spec)


def test_a_registered_type_cannot_be_registered_twice() -> None:
    r = builtins()
    with pytest.raises(PluginError, match="already registered"):
        r.register("scorer", "load", from_dataclass(Load))


def test_a_new_scorer_is_one_class_and_one_registration() -> None:
    class Favourite:
        name = "favourite"
        needs = frozenset({Need.INFLIGHT_REQUESTS})

        def __init__(self, backend: str) -> None:
            self.backend = backend

        def score(self, req: Any, view: ClusterView, candidates: Any) -> list[float]:
            return [1.0 if b.id == self.backend else 0.0 for b in candidates]

    def make(params: Mapping[str, Any]) -> Favourite:
        return Favourite(**params)

    r = builtins()
    r.register("scorer", "favourite", make)
    given = {"scorers": [{"type": "favourite", "params": {"backend": "b"}}]}
    with pytest.raises(ValidationError, match="unknown scorer 'favourite'"):
        PipelineSpec.model_validate(given)
    spec = PipelineSpec.model_validate(given, context={"registry": r})
    p = build_policy(spec, r)
    assert p.needs == {Need.INFLIGHT_REQUESTS}
    view = ClusterView(tuple(BackendView(i, models=frozenset({"m"})) for i in "ab"))
    assert p.decide(RequestInfo(model="m", prompt_tokens=3), view).backend_id == "b"


def test_a_pipeline_needs_what_its_stages_declare() -> None:
    def needs(**kw: Any) -> frozenset[Need]:
        return build_pipeline(PipelineSpec(**kw)).needs

    assert needs(policy="least_load") == frozenset()
    assert needs(policy="round_robin") == frozenset()
    assert needs(policy="cla") == {Need.BLOCK_HASHES}
    assert needs(policy="netkv_full") == {Need.BLOCK_HASHES, Need.ORACLE}
    # Not the scorer's name that counts: prefix_cache, renamed by weight 0, is gone.
    assert needs(policy="cla", scorers={"prefix_cache": 0.0, "load": 1.0}) == frozenset()


def test_a_policy_plugin_given_filters_must_take_them() -> None:
    """A route's filters on a whole-policy plugin reach it through `with_filters`
    (`policies.Refilterable`); one that cannot take them is refused, not run without."""
    from policies import Decision, Refilterable

    class Fixed:
        name = "fixed"
        needs: frozenset[Need] = frozenset()

        def decide(self, req: RequestInfo, view: ClusterView) -> Decision:
            return Decision(view.backends[0].id)

        def ranked(self, req: RequestInfo, view: ClusterView) -> tuple[Decision, ...]:
            return (self.decide(req, view),)

    class Behind(Fixed):
        def __init__(self, filters: tuple[Any, ...] = ()) -> None:
            self.filters = filters

        def with_filters(self, filters: tuple[Any, ...]) -> Behind:
            return Behind(filters)

    r = builtins()
    r.register("policy", "fixed", lambda params: Fixed())
    r.register("policy", "behind", lambda params: Behind())
    given = {"filters": ["healthy", {"type": "memory_feasible", "params": {"max_kv_usage": 0.5}}]}
    spec = PipelineSpec.model_validate({"policy": "fixed", **given}, context={"registry": r})
    with pytest.raises(PluginError, match="policy 'fixed' takes no filters"):
        build_policy(spec, r)
    assert isinstance(build_policy(spec.model_copy(update={"filters": []}), r), Fixed)
    spec = PipelineSpec.model_validate({"policy": "behind", **given}, context={"registry": r})
    policy = build_policy(spec, r)
    assert isinstance(policy, Behind) and isinstance(policy, Refilterable)
    assert not isinstance(Fixed(), Refilterable)
    assert [f.name for f in policy.filters] == ["healthy", "memory_feasible"]
    assert policy.filters[1] == MemoryFeasible(max_kv_usage=0.5)
