"""MoE worker mode: the experts this worker hosts, and what the others cost it.

Each token of each sequence in an iteration activates `top_k` experts per layer. For
Mixtral classes with real per-token records (gsm8k, humaneval) the request replays one
recorded sequence token by token; other classes draw from their calibrated
distribution (`workers.moe`). Experts this worker
does not host are remote calls whose cost (`edgeroute.sim.moe.CostModel`: round trip, the
activations over the link at the configured bandwidth, the remote load and compute)
is added to the iteration; the batch waits for its slowest sequence. Activation counts
are kept per class for the gateway's global scheduler, which can move experts here:
a new placement takes the emulated transfer time of the experts that change.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from workers.engine import Plan, Sequence
from workers.moe import (
    MIXTRAL,
    SHAPES,
    CostModel,
    replayed_token,
    sample_token,
    task_distribution,
)


class MoEConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    shape: str = "mixtral-8x7b"
    hosted: list[tuple[int, int]] | None = None  # (layer, expert); None: all of them
    bandwidth_mbps: float = Field(default=500.0, gt=0)  # the paper's emulated link
    local_expert_ms: float = Field(default=2.0, ge=0)
    rtt_ms: float = Field(default=1.0, ge=0)
    remote_load_ms: float = Field(default=2.0, ge=0)
    hidden_bytes: int = Field(default=8192, gt=0)
    expert_gb: float = Field(default=0.35, gt=0)  # for migrations
    io_gbps: float = Field(default=2.0, gt=0)  # GB/s into this worker's GPUs
    default_class: str = "general"
    seed: int = 0


class MoEHost:
    def __init__(self, config: MoEConfig, data_dir: Path, speedup: float = 1.0) -> None:
        if config.shape not in SHAPES:
            raise ValueError(f"unknown MoE shape {config.shape!r}; known: {sorted(SHAPES)}")
        self.config = config
        self.shape = SHAPES[config.shape]
        self.data_dir = data_dir
        self.speedup = speedup
        self.cost = CostModel(
            local_expert_s=config.local_expert_ms / 1000,
            rtt_s=config.rtt_ms / 1000,
            hidden_bytes=config.hidden_bytes,
            bandwidth_bps=config.bandwidth_mbps * 1e6,
            remote_load_s=config.remote_load_ms / 1000,
        )
        self.rng = np.random.default_rng(config.seed)
        everything = [
            (layer, e) for layer in range(self.shape.layers) for e in range(self.shape.experts)
        ]
        self.hosted = frozenset(map(tuple, config.hosted or everything))
        self.stats: dict[str, np.ndarray] = {}
        self.local_calls = 0
        self.remote_calls = 0
        self.migrations = 0

    def _mask(self) -> np.ndarray:
        mask = np.zeros((self.shape.layers, self.shape.experts), bool)
        for layer, e in self.hosted:
            mask[layer, e] = True
        return mask

    def iteration_cost(self, plan: Plan) -> float:
        """Extra seconds this iteration spends on remote expert calls."""
        mask = self._mask()
        worst = 0
        rows = np.arange(self.shape.layers)[:, None]
        for seq in [*plan.prefill, *plan.decode]:
            cls = seq.task or self.config.default_class
            sel = self._selection(cls, seq)
            counts = self.stats.setdefault(cls, np.zeros((self.shape.layers, self.shape.experts)))
            np.add.at(counts, (rows, sel), 1.0)
            remote = int((~mask[rows, sel]).sum())
            self.remote_calls += remote
            self.local_calls += sel.size - remote
            worst = max(worst, remote)
        return worst * (self.cost.remote_expert_s - self.cost.local_expert_s)

    def _selection(self, cls: str, seq: Sequence) -> np.ndarray:
        if self.shape == MIXTRAL:
            real = replayed_token(cls, seq.id, seq.generated, self.data_dir)
            if real is not None:
                return real
        dist = task_distribution(self.shape, cls, self.data_dir)
        return sample_token(dist, self.shape.top_k, self.rng)

    @property
    def local_ratio(self) -> float:
        total = self.local_calls + self.remote_calls
        return self.local_calls / total if total else 1.0

    async def apply(self, hosted: list[tuple[int, int]]) -> float:
        """Move to a new set of experts; returns the emulated transfer seconds."""
        new = frozenset(map(tuple, hosted))
        seconds = len(new - self.hosted) * self.config.expert_gb / self.config.io_gbps
        await asyncio.sleep(seconds / self.speedup)
        self.hosted = new
        self.migrations += 1
        return seconds

    def report(self) -> dict[str, object]:
        return {
            "shape": self.shape.name,
            "layers": self.shape.layers,
            "experts": self.shape.experts,
            "hosted": sorted(self.hosted),
            "classes": {k: v.tolist() for k, v in self.stats.items()},
            "local_ratio": self.local_ratio,
            "local_calls": self.local_calls,
            "remote_calls": self.remote_calls,
            "migrations": self.migrations,
        }
