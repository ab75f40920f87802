"""The `odmoe` worker mode: a backend that decodes with OD-MoE's on-demand pipeline.

The worker's engine profile stands for the same model fully cached; every decode
iteration additionally pays what `policies.odmoe`'s pipeline loses against that
(eq. 1 stalls, misprediction reloads, the shadow's late departure on KV alignment),
with each layer mispredicted at `layer_miss`. The default miss rate is the int8
shadow's with token and KV alignment every iteration in `edgeroute bench odmoe`.
The worker reports the pipeline's decode speed and each node's GPU memory.
"""

from __future__ import annotations

import random

from policies.odmoe import OdMoEConfig, alignment_seconds, max_load_seconds, token_seconds
from workers.engine import Plan


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
