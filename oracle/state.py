"""The oracle's state as operators push it: validated, versioned by time, immutable.

Every update builds a new state through full validation, so a rejected update
leaves the previous one in place.
"""

from __future__ import annotations

import math
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from oracle.topology import Topology

RHO_CAP = 0.99  # aggregated link utilisation is capped below 1: rho must stay in [0, 1)


class LinkSample(BaseModel):
    """One link's utilisation, as a switch counter reports it."""

    model_config = ConfigDict(extra="forbid")

    tier: str
    utilisation: float = Field(ge=0.0, le=1.0)
    capacity_gbps: float = Field(default=1.0, gt=0)

    @field_validator("utilisation", "capacity_gbps")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v


class OracleState(BaseModel):
    model_config = ConfigDict(frozen=True)

    topology: Topology = Field(default_factory=Topology)
    updated_at: float | None = None  # wall-clock time of the last update; None: never

    def age(self, now: float | None = None) -> float | None:
        """Seconds since the last update, or None for a state nobody has set."""
        if self.updated_at is None:
            return None
        return max(0.0, (now if now is not None else time.time()) - self.updated_at)

    def age_s(self) -> float | None:
        """The age as the API reports it: milliseconds' precision, None if never set."""
        age = self.age()
        return None if age is None else round(age, 3)

    def with_topology(self, static: dict[str, Any]) -> OracleState:
        """Replace the static part; congestion of tiers that still exist is kept."""
        data = self.topology.model_dump()
        data.update(static)
        tiers = set(data.get("tier_bandwidth", {}))
        data["congestion"] = {t: r for t, r in data.get("congestion", {}).items() if t in tiers}
        return OracleState(topology=Topology.model_validate(data), updated_at=time.time())

    def with_congestion(self, rho: dict[str, float]) -> OracleState:
        data = self.topology.model_dump()
        data["congestion"] = rho
        return OracleState(topology=Topology.model_validate(data), updated_at=time.time())

    def with_links(self, samples: list[LinkSample]) -> OracleState:
        """Per-tier rho: the capacity-weighted mean utilisation of the tier's links."""
        load: dict[str, float] = {}
        capacity: dict[str, float] = {}
        for s in samples:
            load[s.tier] = load.get(s.tier, 0.0) + s.utilisation * s.capacity_gbps
            capacity[s.tier] = capacity.get(s.tier, 0.0) + s.capacity_gbps
        rho = dict(self.topology.congestion)
        rho.update({t: min(RHO_CAP, load[t] / capacity[t]) for t in load})
        return self.with_congestion(rho)

    def describe(self) -> dict[str, Any]:
        return {
            **self.topology.model_dump(mode="json"),
            "updated_at": self.updated_at,
            "age_s": self.age_s(),
            "staleness_tolerance": self.topology.staleness_tolerances(),
        }
