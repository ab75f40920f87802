"""Named policies and the spec that configures one, from YAML or the admin API.

A spec names a preset (`policy: cla`) and may override any part of it. Every stage
is a plugin by type name (see `policies.plugins`), written either as its bare name or
with parameters:

    policy: cla
    scorers: {prefix_cache: 0.7, load: 0.3}
    tie_epsilon: 0.02

    policy: least_load
    filters: [healthy, serves_model, {type: memory_feasible, params: {max_kv_usage: 0.9}}]
    scorers: [{type: load, weight: 1.0}, {type: queue_depth, weight: 0.5, params: {cap: 8}}]
    picker: {type: power_of_two}

A policy that is not a pipeline (a learned one) is a plugin of kind "policy":
`policy: qos_drl` with its `params`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator

from policies import filters
from policies.pipeline import Pipeline, Policy, Refilterable
from policies.plugins import PluginError, Registry, default_registry


class PluginRef(BaseModel):
    """One plugin by type, with its parameters."""

    model_config = ConfigDict(extra="forbid")

    type: str
    params: dict[str, Any] = Field(default_factory=dict)


class WeightedRef(PluginRef):
    weight: float = Field(default=1.0, ge=0.0)


DEFAULT_FILTERS = tuple(f.name for f in filters.DEFAULT)
# Structural filters first, so that an empty result names the filter that matters.
DECODE_FILTERS = ("decode_role", "serves_model", "healthy", "kv_feasible")


@dataclass(frozen=True)
class Preset:
    scorers: dict[str, float]
    picker: str = "argmax"
    filters: tuple[str, ...] = DEFAULT_FILTERS
    tie_epsilon: float = 0.01


# A tiny load weight breaks ties among equally good backends by queue length
# without overriding the main signal.
PRESETS: dict[str, Preset] = {
    "round_robin": Preset({}, "round_robin"),
    "random": Preset({}, "random"),
    "least_load": Preset({"load": 1.0}),
    "power_of_two": Preset({"load": 1.0}, "power_of_two"),
    "session_affinity": Preset({"session_affinity": 1.0, "load": 0.05}),
    "prefix_cache": Preset({"prefix_cache": 1.0, "load": 0.05}),
    "cla": Preset({"prefix_cache": 0.5, "load": 0.5}),
    # Prism: local expert coverage of the request's class first, queue length second.
    "prism": Preset({"expert_map": 1.0, "load": 0.3}),
    # The QoS papers' BERT-router (BR): the model predicted to answer best, load aside.
    "best_predicted": Preset({"predicted_quality": 1.0}),
    # Decode-instance selection for disaggregated serving (NetKV's baselines and ladder).
    "decode_rr": Preset({}, "round_robin", DECODE_FILTERS),
    "decode_la": Preset({"load": 1.0}, filters=DECODE_FILTERS),
    "decode_ca": Preset({"prefix_cache": 1.0, "load": 0.05}, filters=DECODE_FILTERS),
    "decode_cla": Preset({"prefix_cache": 0.5, "load": 0.5}, filters=DECODE_FILTERS),
    "netkv_topology": Preset({"netkv_topology": 1.0}, filters=DECODE_FILTERS, tie_epsilon=1e-4),
    "netkv_static": Preset({"netkv_static": 1.0}, filters=DECODE_FILTERS, tie_epsilon=1e-4),
    "netkv_full": Preset({"netkv_full": 1.0}, filters=DECODE_FILTERS, tie_epsilon=1e-4),
}


def _ref(item: str | PluginRef) -> PluginRef:
    return PluginRef(type=item) if isinstance(item, str) else item


class PipelineSpec(BaseModel):
    """How one model's requests are routed."""

    model_config = ConfigDict(extra="forbid")

    policy: str = "least_load"
    params: dict[str, Any] = Field(default_factory=dict)  # a policy plugin's parameters
    filters: list[str | PluginRef] | None = None
    scorers: dict[str, float] | list[WeightedRef] | None = None
    picker: str | PluginRef | None = None
    tie_epsilon: float | None = Field(default=None, ge=0.0, le=1.0)  # argmax's; None: preset's
    model: str | None = None  # qos_drl: the model directory (shorthand for params.model)
    latency_ms: float = Field(default=30.0, gt=0)  # qos_drl: L, the per-token requirement

    @model_validator(mode="after")
    def _known_names(self, info: ValidationInfo) -> PipelineSpec:
        # Checked against the installed plugins, or a registry passed as the context.
        context = info.context if isinstance(info.context, dict) else {}
        registry = context.get("registry") or default_registry()
        if self.policy not in PRESETS and not registry.has("policy", self.policy):
            known = sorted({*PRESETS, *registry.types("policy")})
            raise ValueError(f"unknown policy {self.policy!r}; known: {known}")
        if self.policy in PRESETS and self.params:
            raise ValueError(f"{self.policy!r} is a pipeline preset: give parameters to its stages")
        if self.policy not in PRESETS:
            stages = [
                name
                for name, given in (
                    ("scorers", self.scorers),
                    ("picker", self.picker),
                    ("tie_epsilon", self.tie_epsilon),
                )
                if given is not None
            ]
            if stages:
                raise ValueError(
                    f"{self.policy!r} is a policy plugin: it has no {', '.join(stages)} to set "
                    "(filters and its params only)"
                )
        for f in self.filters or ():
            if not registry.has("filter", _ref(f).type):
                raise ValueError(
                    f"unknown filter {_ref(f).type!r}; known: {registry.types('filter')}"
                )
        for s in self.scorer_refs() if self.scorers is not None else ():
            if not registry.has("scorer", s.type):
                raise ValueError(f"unknown scorer {s.type!r}; known: {registry.types('scorer')}")
            if not s.weight >= 0:
                raise ValueError(f"scorer weight for {s.type!r} must be >= 0")
        if self.picker is not None and not registry.has("picker", _ref(self.picker).type):
            known = registry.types("picker")
            raise ValueError(f"unknown picker {_ref(self.picker).type!r}; known: {known}")
        return self

    def scorer_refs(self) -> list[WeightedRef]:
        """The scorers, the preset's unless overridden."""
        given = self.scorers if self.scorers is not None else PRESETS[self.policy].scorers
        if isinstance(given, dict):
            return [WeightedRef(type=n, weight=w) for n, w in given.items()]
        return list(given)

    def filter_refs(self) -> list[PluginRef]:
        given = self.filters or PRESETS[self.policy].filters
        return [_ref(f) for f in given]

    def picker_ref(self) -> PluginRef:
        preset = PRESETS[self.policy]
        ref = _ref(self.picker or preset.picker)
        if ref.type == "argmax" and "tie_epsilon" not in ref.params:
            epsilon = self.tie_epsilon if self.tie_epsilon is not None else preset.tie_epsilon
            ref = PluginRef(type="argmax", params={**ref.params, "tie_epsilon": epsilon})
        return ref

    def policy_params(self) -> dict[str, Any]:
        """A policy plugin's parameters, with the qos_drl shorthands folded in."""
        params = dict(self.params)
        if self.policy == "qos_drl":
            if self.model is not None:
                params.setdefault("model", self.model)
            params.setdefault("latency_ms", self.latency_ms)
        return params


def build_policy(spec: PipelineSpec, registry: Registry | None = None) -> Policy:
    """A Pipeline for a preset; the registered policy plugin otherwise."""
    registry = registry or default_registry()
    if spec.policy in PRESETS:
        return build_pipeline(spec, registry)
    policy: Policy = registry.create("policy", spec.policy, spec.policy_params())
    if spec.filters:  # none given: the plugin's own
        if not isinstance(policy, Refilterable):
            raise PluginError(f"policy {spec.policy!r} takes no filters")
        policy = policy.with_filters(_made_filters(spec, registry))
    return policy


def _made_filters(spec: PipelineSpec, registry: Registry) -> tuple[Any, ...]:
    """The spec's filters (the preset's unless given), made by the registry."""
    return tuple(registry.create("filter", f.type, f.params) for f in spec.filter_refs())


def build_pipeline(spec: PipelineSpec, registry: Registry | None = None) -> Pipeline:
    registry = registry or default_registry()
    picker = spec.picker_ref()
    return Pipeline(
        name=spec.policy,
        filters=_made_filters(spec, registry),
        scorers=tuple(
            (registry.create("scorer", s.type, s.params), s.weight)
            for s in spec.scorer_refs()
            if s.weight > 0
        ),
        picker=registry.create("picker", picker.type, picker.params),
    )
