"""The simulator's state as the router's features (the gateway builds the same ones)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from policies.qos_state import ExpertSnapshot, QueuedRequest, encode

if TYPE_CHECKING:
    from sim.edge import EdgeEnv, ExpertState, Req


def _queued(r: Req, e: ExpertState, now: float) -> QueuedRequest:
    return QueuedRequest(
        r.prompt_tokens,
        r.pred_score,
        r.pred_length,
        r.tokens / e.spec.memory_tokens,
        r.generated,
        r.latency_per_token(now),
    )


def observe(env: EdgeEnv, n_max: int | None = None) -> dict[str, np.ndarray]:
    now = env.now
    experts = [
        ExpertSnapshot(
            e.memory(),
            [_queued(r, e, now) for r in e.running + e.fresh],
            [_queued(r, e, now) for r in e.waiting],
            e.spec.running_cap,
            e.spec.waiting_cap,
        )
        for e in env.experts
    ]
    return encode(env.task.prompt_tokens, env.preds, experts, env.L, n_max)
