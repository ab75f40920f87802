"""OD-MoE's decoding pipeline timing (the OD-MoE paper, section 3.1, Fig. 2, eq. 1).

Worker nodes are split into groups of G; layer l's experts are computed by group
l mod n_groups, which loads them on demand (from the shadow model's prediction) as
soon as it has finished its previous layer, l - n_groups. The main node computes the
non-expert part of each layer (t_M, communication included), then the group computes
the experts (t_W). Loading one expert takes size / host-to-device bandwidth.

No stall while loading fits the window of eq. 1. The paper writes
`t_maxload = G t_M + (G - 1) t_W` with G the group size, but its worked example (8
workers in groups of 2: `4 t_M + 3 t_W`) and Fig. 2 use the number of groups; so does
`max_load_seconds`. A misprediction means the right expert is loaded only once the
gating (in the main-node step) has chosen it: the layer waits a full load.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field


@dataclass(frozen=True)
class PipelineConfig:
    workers: int = 8
    group_size: int = 2  # = top-k: each worker of a group holds one chosen expert
    t_main: float = 0.004  # s: main-node layer computation, communication included
    t_worker: float = 0.003  # s: expert computation on a worker, communication included
    expert_bytes: float = 352e6  # Mixtral-8x7B expert at fp16
    h2d_bandwidth: float = 12e9  # bytes/s, host-to-device
    kv_bytes_per_token_layer: float = 8e3  # the paper's figure for Mixtral
    link_bytes_per_s: float = 1e9 / 8  # 1 Gbps Ethernet between the nodes

    @property
    def groups(self) -> int:
        return self.workers // self.group_size

    @property
    def load_seconds(self) -> float:
        return self.expert_bytes / self.h2d_bandwidth


def alignment_seconds(cfg: PipelineConfig, layers: int, kv: bool) -> float:
    """The shadow's late departure: the newest token's KV cache sent before it starts
    (the token itself is a few bytes)."""
    return layers * cfg.kv_bytes_per_token_layer / cfg.link_bytes_per_s if kv else 0.0


def max_load_seconds(cfg: PipelineConfig) -> float:
    """Eq. 1 (with the number of groups): the loading window that causes no stall."""
    return cfg.groups * cfg.t_main + (cfg.groups - 1) * cfg.t_worker


@dataclass(frozen=True)
class LayerTiming:
    main_end: float
    loaded_at: float
    compute_start: float
    compute_end: float

    @property
    def stall(self) -> float:
        return self.compute_start - self.main_end


def decode_token(
    cfg: PipelineConfig,
    layers: int,
    mispredicted: Sequence[bool] = (),
    start: float = 0.0,
    group_free: Sequence[float] | None = None,
    prediction_delay: float = 0.0,
) -> list[LayerTiming]:
    """The timeline of one decoding step through `layers` layers.

    A positive `prediction_delay` (the shadow's late departure when aligned at this
    token) holds every load until `start + prediction_delay`; with none, a group loads
    as soon as it is free (`group_free`, default `start`).
    """
    free = list(group_free) if group_free is not None else [start] * cfg.groups
    if prediction_delay > 0:
        free = [max(f, start + prediction_delay) for f in free]
    out: list[LayerTiming] = []
    t = start
    for layer in range(layers):
        g = layer % cfg.groups
        main_end = t + cfg.t_main
        miss = layer < len(mispredicted) and mispredicted[layer]
        load_from = main_end if miss else free[g]  # a miss reloads after the gating
        loaded_at = load_from + cfg.load_seconds
        compute_start = max(main_end, loaded_at)
        compute_end = compute_start + cfg.t_worker
        free[g] = compute_end  # the group loads its next layer from here
        out.append(LayerTiming(main_end, loaded_at, compute_start, compute_end))
        t = compute_end
    return out


def token_seconds(
    cfg: PipelineConfig,
    layers: int,
    mispredicted: Sequence[bool] = (),
    prediction_delay: float = 0.0,
) -> float:
    timeline = decode_token(cfg, layers, mispredicted, prediction_delay=prediction_delay)
    return timeline[-1].compute_end - timeline[0].main_end + cfg.t_main


class OdMoEConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    layers: int = Field(default=32, ge=1)
    workers: int = Field(default=8, ge=1)
    group_size: int = Field(default=2, ge=1)
    t_main_ms: float = Field(default=4.0, ge=0)
    t_worker_ms: float = Field(default=3.0, ge=0)
    expert_mb: float = Field(default=352.0, gt=0)
    h2d_gbps: float = Field(default=12.0, gt=0)
    # The int8 shadow aligned every token, on the trained model (`bench odmoe`).
    layer_miss: float = Field(default=0.004, ge=0, le=1)
    kv_period: int | None = Field(default=1, ge=1)  # None: the shadow is never KV-aligned
    # Mixtral-8x7B: 46.7 B parameters, of which 32 x 8 experts of 176 M. The main node
    # holds the rest at fp16, (46.7e9 - 32 * 8 * 176e6) * 2 bytes; the shadow node the
    # whole model at int8.
    dense_gb: float = Field(default=3.29, ge=0)
    shadow_gb: float = Field(default=46.7, ge=0)
    seed: int = 0

    def pipeline(self) -> PipelineConfig:
        return PipelineConfig(
            workers=self.workers,
            group_size=self.group_size,
            t_main=self.t_main_ms / 1000,
            t_worker=self.t_worker_ms / 1000,
            expert_bytes=self.expert_mb * 1e6,
            h2d_bandwidth=self.h2d_gbps * 1e9,
        )

    def expected_token_seconds(self) -> float:
        """One decode step through eq. 1's pipeline, in expectation: the late departure
        every `kv_period` steps, and a full load for each mispredicted layer (exact when
        a miss does not overlap another stall). The gateway's latency model for an
        OD-MoE backend."""
        pipe = self.pipeline()
        plain = token_seconds(pipe, self.layers)
        if self.kv_period is None:
            base = plain
        else:
            late = alignment_seconds(pipe, self.layers, kv=True)
            aligned = token_seconds(pipe, self.layers, prediction_delay=late)
            base = (aligned + (self.kv_period - 1) * plain) / self.kv_period
        return base + self.layer_miss * self.layers * pipe.load_seconds
