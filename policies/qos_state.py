"""The QoS-DRL router's state features (the QoS paper's eq. 6-7 and 9-12), in numpy.

One snapshot builder (`snapshot`, from a backend's view) and one encoder, for training
(the edge-expert simulator, which presents its experts as backend views) and serving
(the gateway's live view), so the ONNX graph always sees features built the same way.

- request (eq. 6): prompt tokens, predicted score, predicted length, its share of the
  expert's memory, tokens generated so far, latency per token so far (/ L);
- expert (eq. 10): memory use, running and waiting counts (/ capacity), and the arrived
  request's predicted score and length on this expert (the arrived node is linked to
  every expert; its expert-specific predictions live on that link's expert end);
- arrived (eq. 9): prompt tokens and its mean predictions.

Shapes: arrived [6], experts [N, 5], running [N, R, 6], waiting [N, W, 6], with masks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from policies.types import BackendView

MAX_TOKENS = 300.0
F_REQ, F_EXPERT = 6, 5


@dataclass(frozen=True, slots=True)
class QueuedRequest:
    prompt_tokens: int
    pred_score: float
    pred_length: float
    memory_share: float  # e_{j,n,t}: its tokens over the expert's memory
    generated: int
    latency_per_token: float  # seconds


@dataclass(frozen=True, slots=True)
class ExpertSnapshot:
    memory: float  # e_{n,t}
    running: Sequence[QueuedRequest]
    waiting: Sequence[QueuedRequest]
    running_cap: int = 5
    waiting_cap: int = 5


def snapshot(
    b: BackendView, now: float, stale_after: float, running_cap: int = 5
) -> ExpertSnapshot:
    """One backend's state: its in-flight requests, oldest first, with their progress.
    The oldest are the running batch: as many as the engine reports running when its
    figures are fresh, else up to the batch cap."""
    queued = []
    cap = max(1, b.kv_capacity_tokens)
    for r in sorted(b.requests, key=lambda r: r.started_at):
        share = (r.prompt_tokens + r.generated) / cap if b.kv_capacity_tokens else 0.0
        queued.append(
            QueuedRequest(
                r.prompt_tokens,
                r.pred_score,
                r.pred_length,
                share,
                r.generated,
                max(0.0, now - r.started_at) / max(1, r.generated),
            )
        )
    fresh = b.stats_age <= stale_after
    batch = min(b.running, running_cap) if fresh else running_cap
    return ExpertSnapshot(b.kv_usage, queued[:batch], queued[batch:])


def _req(r: QueuedRequest, latency_req: float) -> list[float]:
    return [
        r.prompt_tokens / 1000.0,
        r.pred_score,
        r.pred_length / MAX_TOKENS,
        r.memory_share,
        r.generated / MAX_TOKENS,
        min(5.0, r.latency_per_token / latency_req),
    ]


def encode(
    prompt_tokens: int,
    preds: Sequence[tuple[float, float]],
    experts: Sequence[ExpertSnapshot],
    latency_req: float,
    n_max: int | None = None,
    queue_cap: int = 5,
) -> dict[str, np.ndarray]:
    """Dense, padded arrays for one decision. `preds[n]` is (score, length) on expert n."""
    n = len(experts)
    n_max = n_max or n
    arrived = np.zeros(F_REQ, np.float32)
    scores = [p[0] for p in preds] or [0.0]
    lengths = [p[1] for p in preds] or [0.0]
    arrived[:3] = (
        prompt_tokens / 1000.0,
        float(np.mean(scores)),
        float(np.mean(lengths)) / MAX_TOKENS,
    )
    ex = np.zeros((n_max, F_EXPERT), np.float32)
    run = np.zeros((n_max, queue_cap, F_REQ), np.float32)
    wait = np.zeros((n_max, queue_cap, F_REQ), np.float32)
    ex_mask = np.zeros(n_max, np.float32)
    run_mask = np.zeros((n_max, queue_cap), np.float32)
    wait_mask = np.zeros((n_max, queue_cap), np.float32)
    for i, e in enumerate(experts):
        ex[i] = (
            e.memory,
            len(e.running) / e.running_cap,
            len(e.waiting) / e.waiting_cap,
            preds[i][0],
            preds[i][1] / MAX_TOKENS,
        )
        ex_mask[i] = 1.0
        for k, r in enumerate(list(e.running)[:queue_cap]):
            run[i, k] = _req(r, latency_req)
            run_mask[i, k] = 1.0
        for k, r in enumerate(list(e.waiting)[:queue_cap]):
            wait[i, k] = _req(r, latency_req)
            wait_mask[i, k] = 1.0
    return {
        "arrived": arrived,
        "experts": ex,
        "running": run,
        "waiting": wait,
        "expert_mask": ex_mask,
        "running_mask": run_mask,
        "waiting_mask": wait_mask,
    }


INPUTS = ("arrived", "experts", "running", "waiting", "expert_mask", "running_mask", "waiting_mask")
