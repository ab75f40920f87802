"""The `odmoe` worker mode: a backend that decodes with OD-MoE's on-demand pipeline.

The worker's engine profile stands for the same model fully cached; every decode
iteration additionally pays what `workers.odmoe`'s pipeline loses against that
(eq. 1 stalls, misprediction reloads, the shadow's late departure on KV alignment),
with each layer mispredicted at `layer_miss`. The default miss rate is the int8
shadow's with token and KV alignment every iteration in `edgeroute bench odmoe`.
The worker reports the pipeline's decode speed and each node's GPU memory.
"""

from __future__ import annotations

import random

from pydantic import BaseModel, ConfigDict, Field

from workers.engine import Plan
from workers.odmoe import PipelineConfig, alignment_seconds, max_load_seconds, token_seconds


class OdMoEConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    layers: int = Field(default=32, ge=1)
    workers: int = Field(default=8, ge=1)
    group_size: int = Field(default=2, ge=1)
    t_main_ms: float = Field(default=4.0, ge=0)
    t_worker_ms: float = Field(default=3.0, ge=0)
    expert_mb: float = Field(default=352.0, gt=0)
    h2d_gbps: float = Field(default=12.0, gt=0)
    layer_miss: float = Field(default=0.015, ge=0, le=1)
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


class OdMoEHost:
    def __init__(self, config: OdMoEConfig) -> None:
        self.config = config
        self.pipe = config.pipeline()
        self.cached = config.layers * (self.pipe.t_main + self.pipe.t_worker)
        self.rng = random.Random(config.seed)
        self.steps = 0
        self.seconds = 0.0
        self.mispredicted_layers = 0

    def iteration_cost(self, plan: Plan) -> float:
        """Seconds a decode iteration loses against the fully cached model."""
        if not plan.decode:
            return 0.0
        return max(0.0, self.sample_token_seconds() - self.cached)

    def sample_token_seconds(self) -> float:
        """One decode step through the pipeline, with misses drawn at `layer_miss` and
        the late departure on every `kv_period`-th step."""
        c = self.config
        misses = [self.rng.random() < c.layer_miss for _ in range(c.layers)]
        aligned = c.kv_period is not None and self.steps % c.kv_period == 0
        delay = alignment_seconds(self.pipe, c.layers, kv=True) if aligned else 0.0
        t = token_seconds(self.pipe, c.layers, misses, prediction_delay=delay)
        self.steps += 1
        self.seconds += t
        self.mispredicted_layers += sum(misses)
        return t

    def report(self) -> dict[str, object]:
        c = self.config
        return {
            "decode_steps": self.steps,
            "decode_tokens_per_s": self.steps / self.seconds if self.seconds else None,
            "cached_tokens_per_s": 1 / self.cached,
            "mispredicted_layers": self.mispredicted_layers,
            "eq1_window_s": max_load_seconds(self.pipe),
            "expert_load_s": self.pipe.load_seconds,
            "memory_gb": {
                "main": c.dense_gb,
                "shadow": c.shadow_gb,
                **{f"worker-{i}": c.expert_mb / 1000 for i in range(c.workers)},
            },
        }
