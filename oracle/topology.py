"""Network topology: which tier joins two instances, and what a transfer over it costs.

One description serves the NetKV oracle, the emulated workers' KV transfers and
the simulators. Tiers come from locality labels (same node, rack, pod) or from
explicit pair overrides.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from oracle import cost

TIERS = ("node", "rack", "pod", "cluster")
LABELS = ("node", "rack", "pod")


class TierPair(BaseModel):
    model_config = ConfigDict(extra="forbid")
    a: str
    b: str
    tier: str


class Topology(BaseModel):
    """Instances, their locality and the per-tier network."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    instances: dict[str, dict[str, str]] = Field(default_factory=dict)
    tier_map: list[TierPair] = Field(default_factory=list)
    tier_bandwidth: dict[str, float] = Field(
        default_factory=lambda: {"node": 400.0, "rack": 200.0, "pod": 100.0, "cluster": 50.0}
    )
    tier_latency: dict[str, float] = Field(
        default_factory=lambda: {"node": 2.0, "rack": 5.0, "pod": 10.0, "cluster": 20.0}
    )
    congestion: dict[str, float] = Field(default_factory=dict)

    @field_validator("tier_bandwidth")
    @classmethod
    def _positive_bandwidth(cls, v: dict[str, float]) -> dict[str, float]:
        for tier, gbps in v.items():
            if not (math.isfinite(gbps) and gbps > 0):
                raise ValueError(f"tier_bandwidth[{tier!r}] must be a positive number of Gbps")
        return v

    @field_validator("tier_latency")
    @classmethod
    def _non_negative_latency(cls, v: dict[str, float]) -> dict[str, float]:
        for tier, us in v.items():
            if not (math.isfinite(us) and us >= 0):
                raise ValueError(f"tier_latency[{tier!r}] must be >= 0 microseconds")
        return v

    @field_validator("congestion")
    @classmethod
    def _rho_in_range(cls, v: dict[str, float]) -> dict[str, float]:
        for tier, rho in v.items():
            if not (math.isfinite(rho) and 0.0 <= rho < 1.0):
                raise ValueError(f"congestion[{tier!r}] must be in [0, 1)")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> Topology:
        known = set(self.tier_bandwidth)
        for pair in self.tier_map:
            if pair.tier not in known:
                raise ValueError(f"tier_map names unknown tier {pair.tier!r}")
            if self.instances and not {pair.a, pair.b} <= set(self.instances):
                raise ValueError(f"tier_map names unknown instance in ({pair.a}, {pair.b})")
        for tier in self.congestion:
            if tier not in known:
                raise ValueError(f"congestion names unknown tier {tier!r}")
        return self

    def tier(self, a: str, b: str) -> str:
        """The tier a transfer from `a` to `b` crosses."""
        for pair in self.tier_map:
            if {pair.a, pair.b} == {a, b}:
                return pair.tier
        la, lb = self.instances.get(a, {}), self.instances.get(b, {})
        for label in LABELS:
            if label in la and la.get(label) == lb.get(label):
                return label if label in self.tier_bandwidth else self._slowest()
        return self._slowest()

    def _slowest(self) -> str:
        return min(self.tier_bandwidth, key=self.tier_bandwidth.__getitem__)

    def effective_bandwidth(self, tier: str, self_contention: int = 0) -> float:
        """Bytes per second: B_tier * (1 - rho) / (1 + c_self)."""
        return cost.effective_bandwidth(
            self.tier_bandwidth[tier], self.congestion.get(tier, 0.0), self_contention
        )

    def transfer_seconds(self, a: str, b: str, nbytes: float, self_contention: int = 0) -> float:
        """T_x = lat_tier + S / B_eff."""
        tier = self.tier(a, b)
        return cost.transfer_seconds(
            nbytes,
            self.tier_bandwidth[tier],
            self.tier_latency.get(tier, 0.0),
            self.congestion.get(tier, 0.0),
            self_contention,
        )

    def tiers_by_speed(self) -> list[str]:
        """Tiers from the fastest to the slowest static bandwidth."""
        return sorted(self.tier_bandwidth, key=self.tier_bandwidth.__getitem__, reverse=True)

    def staleness_tolerances(self) -> dict[str, float]:
        """Proposition 2 for each pair of adjacent tiers, at the current congestion."""
        order = self.tiers_by_speed()
        out = {}
        for fast, slow in itertools.pairwise(order):
            beta = self.tier_bandwidth[fast] / self.tier_bandwidth[slow]
            out[f"{fast}>{slow}"] = cost.staleness_tolerance(
                beta, self.congestion.get(fast, 0.0), self.congestion.get(slow, 0.0)
            )
        return out

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Topology:
        return cls.model_validate(dict(data))
