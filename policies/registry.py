"""Named policies and the spec that configures a pipeline, from YAML or the admin API.

A spec names a preset (`policy: cla`) and may override any part of it:

    policy: cla
    scorers: {prefix_cache: 0.7, load: 0.3}
    tie_epsilon: 0.02
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from policies import filters, pickers, scorers
from policies.pipeline import Filter, Picker, Pipeline, Scorer

FILTERS: dict[str, Callable[[], Filter]] = {
    "healthy": filters.Healthy,
    "serves_model": filters.ServesModel,
    "role": filters.Role,
    "memory_feasible": filters.MemoryFeasible,
}

SCORERS: dict[str, Callable[[], Scorer]] = {
    "load": scorers.Load,
    "prefix_cache": scorers.PrefixCache,
    "session_affinity": scorers.SessionAffinity,
}

PICKERS = ("argmax", "power_of_two", "round_robin", "random")

DEFAULT_FILTERS = ("healthy", "serves_model", "role")

# Each preset: (scorers with weights, picker). A tiny load weight breaks ties
# among equally good backends by queue length without overriding the main signal.
PRESETS: dict[str, tuple[dict[str, float], str]] = {
    "round_robin": ({}, "round_robin"),
    "random": ({}, "random"),
    "least_load": ({"load": 1.0}, "argmax"),
    "power_of_two": ({"load": 1.0}, "power_of_two"),
    "session_affinity": ({"session_affinity": 1.0, "load": 0.05}, "argmax"),
    "prefix_cache": ({"prefix_cache": 1.0, "load": 0.05}, "argmax"),
    "cla": ({"prefix_cache": 0.5, "load": 0.5}, "argmax"),
}


class PipelineSpec(BaseModel):
    """How one model's requests are routed."""

    model_config = ConfigDict(extra="forbid")

    policy: str = "least_load"
    filters: list[str] | None = None
    scorers: dict[str, float] | None = None
    picker: str | None = None
    tie_epsilon: float = Field(default=0.01, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _known_names(self) -> PipelineSpec:
        if self.policy not in PRESETS:
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


def build_pipeline(spec: PipelineSpec) -> Pipeline:
    preset_scorers, preset_picker = PRESETS[spec.policy]
    weights = spec.scorers if spec.scorers is not None else preset_scorers
    return Pipeline(
        name=spec.policy,
        filters=tuple(FILTERS[n]() for n in (spec.filters or DEFAULT_FILTERS)),
        scorers=tuple((SCORERS[n](), w) for n, w in weights.items() if w > 0),
        picker=_picker(spec.picker or preset_picker, spec.tie_epsilon),
    )
