"""The QoS-DRL router's state features (the QoS paper's eq. 6-7 and 9-12), in numpy.

One snapshot builder (`snapshot`, from a backend's view) and one encoder, for training
(the edge-expert simulator, which presents its experts as backend views) and serving
(the gateway's live view), so the ONNX graph always sees features built the same way.

- request (eq. 6): prompt tokens, predicted score, predicted length, its share of the
  expert's memory, tokens generated so far, latency per token so far (/ L);
- expert (eq. 10): memory use, running and waiting counts (/ capacity), and the arrived
  request's predicted score and length on this expert (the arrived node is linked to
  every expert; its expert-specific predictions live on that link's expert end); and,
  beyond the paper, its measured seconds per token over recent requests (/ L), which
  tells hardware apart before its queue does;
- arrived (eq. 9): prompt tokens and its mean predictions.

Shapes: arrived [6], experts [N, 6], running [N, R, 6], waiting [N, W, 6], with masks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from policies.types import BackendView

MAX_TOKENS = 300.0
F_REQ, F_EXPERT = 6, 6


@dataclass(frozen=True, slots=True)
class ExpertSnapshot:
    """One expert's state: its memory use and its in-flight requests, oldest first, as
    feature rows (eq. 6) whose last column still holds seconds per token (`encode`
    divides by L). The first `running` rows are the running batch, the rest wait."""

    memory: float  # e_{n,t}
    queue: np.ndarray  # [k, F_REQ]
    running: int
    token_latency: float = 0.0  # s per token of its recent requests (0: none yet)
    running_cap: int = 5
    waiting_cap: int = 5

    @property
    def waiting(self) -> int:
        return len(self.queue) - self.running


# A backend's requests change only when the gateway rebuilds its view of it; between
# rebuilds the same tuple comes back, and its rows need only their latency refreshed.
_Static = tuple[np.ndarray, np.ndarray, np.ndarray]  # rows, started_at, max(1, generated)
FeatureCache = dict[str, tuple[object, int, _Static]]


TOKEN_LATENCY_WEIGHT = 0.2


def token_latency_mix(average: float, latest: float) -> float:
    """A backend's seconds per token over its recent requests (`BackendView.
    token_latency`): the latest finished request weighs TOKEN_LATENCY_WEIGHT; an
    average of 0 means none yet. The gateway and the simulator keep it alike."""
    if average == 0:
        return latest
    return (1 - TOKEN_LATENCY_WEIGHT) * average + TOKEN_LATENCY_WEIGHT * latest


def _static(b: BackendView) -> _Static:
    reqs = sorted(b.requests, key=lambda r: r.started_at)
    a = np.array(
        [(r.prompt_tokens, r.pred_score, r.pred_length, r.generated, r.started_at) for r in reqs],
        np.float64,
    ).reshape(len(reqs), 5)
    rows = np.zeros((len(reqs), F_REQ))
    rows[:, 0] = a[:, 0] / 1000.0
    rows[:, 1] = a[:, 1]
    rows[:, 2] = a[:, 2] / MAX_TOKENS
    if b.kv_capacity_tokens:
        rows[:, 3] = (a[:, 0] + a[:, 3]) / max(1, b.kv_capacity_tokens)
    rows[:, 4] = a[:, 3] / MAX_TOKENS
    return rows, a[:, 4], np.maximum(1.0, a[:, 3])


def snapshot(
    b: BackendView,
    now: float,
    stale_after: float,
    running_cap: int = 5,
    cache: FeatureCache | None = None,
) -> ExpertSnapshot:
    """One backend's state: its in-flight requests, oldest first, with their progress.
    The oldest are the running batch: as many as the engine reports running when its
    figures are fresh, else up to the batch cap. `cache` keeps each backend's rows
    between calls while its view is unchanged."""
    found = cache.get(b.id) if cache is not None else None
    if found is not None and found[0] is b.requests and found[1] == b.kv_capacity_tokens:
        static = found[2]
    else:
        static = _static(b)
        if cache is not None:
            cache[b.id] = (b.requests, b.kv_capacity_tokens, static)
    rows, started, per_token = static
    queue = rows.copy()
    queue[:, 5] = np.maximum(0.0, now - started) / per_token
    fresh = b.stats_age <= stale_after
    batch = min(b.running, running_cap) if fresh else running_cap
    return ExpertSnapshot(b.kv_usage, queue, min(batch, len(queue)), b.token_latency)


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
    # Filled in float64 and scaled at once, then stored as float32 like the rest.
    queues = np.zeros((2, n_max, queue_cap, F_REQ))  # running, waiting
    masks = np.zeros((2, n_max, queue_cap), np.float32)
    ex_mask = np.zeros(n_max, np.float32)
    ex_mask[:n] = 1.0
    if n:
        ex[:n] = [
            (
                e.memory,
                e.running / e.running_cap,
                e.waiting / e.waiting_cap,
                preds[i][0],
                preds[i][1] / MAX_TOKENS,
                min(5.0, e.token_latency / latency_req),
            )
            for i, e in enumerate(experts)
        ]
    for i, e in enumerate(experts):
        r = min(e.running, queue_cap)
        w = min(e.waiting, queue_cap)
        queues[0, i, :r] = e.queue[:r]
        queues[1, i, :w] = e.queue[e.running : e.running + w]
        masks[0, i, :r] = 1.0
        masks[1, i, :w] = 1.0
    queues[..., 5] = np.minimum(5.0, queues[..., 5] / latency_req)  # in multiples of L
    run, wait = queues.astype(np.float32)
    run_mask, wait_mask = masks
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
