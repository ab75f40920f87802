"""Named policies and the spec that configures a pipeline, from YAML or the admin API.

A spec names a preset (`policy: cla`) and may override any part of it:

    policy: cla
    scorers: {prefix_cache: 0.7, load: 0.3}
    tie_epsilon: 0.02
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, model_validator

from policies import filters, netkv, pickers, scorers
from policies.pipeline import Filter, Picker, Pipeline, Policy, Scorer

FILTERS: dict[str, Callable[[], Filter]] = {
    "healthy": filters.Healthy,
    "serves_model": filters.ServesModel,
    "role": filters.Role,
    "prefill_role": lambda: filters.Role(role="prefill", name="prefill_role"),
    "decode_role": lambda: filters.Role(role="decode", name="decode_role"),
    "memory_feasible": filters.MemoryFeasible,
    "kv_feasible": netkv.KVFeasible,
}

SCORERS: dict[str, Callable[[], Scorer]] = {
    "load": scorers.Load,
    "prefix_cache": scorers.PrefixCache,
    "session_affinity": scorers.SessionAffinity,
    "expert_map": scorers.ExpertMap,
    "netkv_topology": lambda: netkv.NetKVCost(False, False, name="netkv_topology"),
    "netkv_static": lambda: netkv.NetKVCost(True, False, name="netkv_static"),
    "netkv_full": lambda: netkv.NetKVCost(True, True, name="netkv_full"),
}

PICKERS = ("argmax", "power_of_two", "round_robin", "random")

DEFAULT_FILTERS = ("healthy", "serves_model", "role")
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
    # Decode-instance selection for disaggregated serving (NetKV's baselines and ladder).
    "decode_rr": Preset({}, "round_robin", DECODE_FILTERS),
    "decode_la": Preset({"load": 1.0}, filters=DECODE_FILTERS),
    "decode_ca": Preset({"prefix_cache": 1.0, "load": 0.05}, filters=DECODE_FILTERS),
    "decode_cla": Preset({"prefix_cache": 0.5, "load": 0.5}, filters=DECODE_FILTERS),
    "netkv_topology": Preset({"netkv_topology": 1.0}, filters=DECODE_FILTERS, tie_epsilon=1e-4),
    "netkv_static": Preset({"netkv_static": 1.0}, filters=DECODE_FILTERS, tie_epsilon=1e-4),
    "netkv_full": Preset({"netkv_full": 1.0}, filters=DECODE_FILTERS, tie_epsilon=1e-4),
}


class PipelineSpec(BaseModel):
    """How one model's requests are routed."""

    model_config = ConfigDict(extra="forbid")

    policy: str = "least_load"
    filters: list[str] | None = None
    scorers: dict[str, float] | None = None
    picker: str | None = None
    tie_epsilon: float | None = Field(default=None, ge=0.0, le=1.0)  # None: the preset's
    model: str | None = None  # qos_drl: the model directory (default: models/qos)
    latency_ms: float = Field(default=30.0, gt=0)  # qos_drl: L, the per-token requirement

    @model_validator(mode="after")
    def _known_names(self) -> PipelineSpec:
        if self.policy not in PRESETS and self.policy not in LEARNED:
            raise ValueError(f"unknown policy {self.policy!r}; known: {sorted(PRESETS)}")
        for name in self.filters or ():
            if name not in FILTERS:
                raise ValueError(f"unknown filter {name!r}; known: {sorted(FILTERS)}")
        for name, weight in (self.scorers or {}).items():
            if name not in SCORERS:
                raise ValueError(f"unknown scorer {name!r}; known: {sorted(SCORERS)}")
            if not weight >= 0:
                raise ValueError(f"scorer weight for {name!r} must be >= 0")
        if self.picker is not None and self.picker not in PICKERS:
            raise ValueError(f"unknown picker {self.picker!r}; known: {list(PICKERS)}")
        return self


def _picker(name: str, tie_epsilon: float) -> Picker:
    if name == "argmax":
        return pickers.Argmax(tie_epsilon=tie_epsilon)
    if name == "power_of_two":
        return pickers.PowerOfTwo()
    if name == "round_robin":
        return pickers.RoundRobin()
    return pickers.Random()


LEARNED = ("qos_drl",)


def build_policy(spec: PipelineSpec) -> Policy:
    """A Pipeline for the presets; the learned policy for `qos_drl`."""
    if spec.policy == "qos_drl":
        from pathlib import Path

        from policies.qos_drl import DEFAULT_MODEL_DIR, QoSDRL

        return QoSDRL(Path(spec.model) if spec.model else DEFAULT_MODEL_DIR, spec.latency_ms)
    return build_pipeline(spec)


def build_pipeline(spec: PipelineSpec) -> Pipeline:
    preset = PRESETS[spec.policy]
    weights = spec.scorers if spec.scorers is not None else preset.scorers
    epsilon = spec.tie_epsilon if spec.tie_epsilon is not None else preset.tie_epsilon
    return Pipeline(
        name=spec.policy,
        filters=tuple(FILTERS[n]() for n in (spec.filters or preset.filters)),
        scorers=tuple((SCORERS[n](), w) for n, w in weights.items() if w > 0),
        picker=_picker(spec.picker or preset.picker, epsilon),
    )
