"""Named engine profiles: the constants of the emulated engine's cost and memory model.

Iteration time (the QoS paper's eq. 13-14 shape):

    t_iter = base + k1 * prefill_tokens + k2 * sum(context tokens of the decode batch)

The six expert profiles carry the names of the open models in RouterBench, so
their answer lengths and quality come from that model's real data. Their time
constants are not measurements of those models: they are chosen to span
20-40 ms per output token at light load, with prefill and KV memory growing
with model size, as edge servers with one GPU each would show.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class EngineProfile:
    name: str
    data_model: str | None  # column name in the quality data, None for synthetic profiles
    base: float  # s per iteration
    k1: float  # s per prefill token
    k2: float  # s per context token in the decode batch
    kv_blocks: int
    block_size: int = 16
    max_batch: int = 256
    max_batched_tokens: int = 8192
    max_model_len: int = 32768
    kv_bytes_per_token: int = 131072  # 2 * layers * kv_heads * head_dim * 2 bytes

    def blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    def iteration_time(self, prefill_tokens: int, decode_context_tokens: int) -> float:
        return self.base + self.k1 * prefill_tokens + self.k2 * decode_context_tokens

    def with_overrides(self, **changes: float | int) -> EngineProfile:
        return replace(self, **changes)  # type: ignore[arg-type]


PROFILES: dict[str, EngineProfile] = {
    p.name: p
    for p in (
        EngineProfile(
            "mistral-7b-chat",
            "mistralai/mistral-7b-chat",
            base=0.020,
            k1=0.00012,
            k2=2.0e-6,
            kv_blocks=4096,
        ),
        EngineProfile(
            "WizardLM-13B-V1.2",
            "WizardLM/WizardLM-13B-V1.2",
            base=0.026,
            k1=0.00020,
            k2=3.0e-6,
            kv_blocks=2048,
            kv_bytes_per_token=819200,
        ),
        EngineProfile(
            "mixtral-8x7b-chat",
            "mistralai/mixtral-8x7b-chat",
            base=0.028,
            k1=0.00025,
            k2=2.5e-6,
            kv_blocks=3072,
        ),
        EngineProfile(
            "Yi-34B-Chat",
            "zero-one-ai/Yi-34B-Chat",
            base=0.034,
            k1=0.00040,
            k2=4.0e-6,
            kv_blocks=2048,
            kv_bytes_per_token=245760,
        ),
        EngineProfile(
            "code-llama-instruct-34b",
            "meta/code-llama-instruct-34b-chat",
            base=0.034,
            k1=0.00040,
            k2=4.0e-6,
            kv_blocks=2048,
            kv_bytes_per_token=196608,
        ),
        EngineProfile(
            "llama-2-70b-chat",
            "meta/llama-2-70b-chat",
            base=0.040,
            k1=0.00060,
            k2=6.0e-6,
            kv_blocks=1536,
            kv_bytes_per_token=327680,
        ),
        # Zero-cost engine for measuring the gateway itself.
        EngineProfile("instant", None, base=0.0, k1=0.0, k2=0.0, kv_blocks=1 << 20),
    )
}

EXPERTS = tuple(p for p in PROFILES if PROFILES[p].data_model is not None)
