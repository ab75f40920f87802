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
