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
- arrived (eq. 9): prompt tokens and its mean predictions;
- load, beyond the paper: the requests arriving per second per candidate (`Arrivals`),
  which tells how fast a queue will grow, where the counts tell only how long it is.
  An actor trained without it does not read it.

Shapes: arrived [6], experts [N, 6], queues [N, 2, 5, 6] (each expert's running, then
waiting requests, padded to 5 each), load [1], with masks experts [N] and queues
[N, 2, 5].
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from policies.types import BackendView, InflightRequest

MAX_TOKENS = 300.0
F_REQ, F_EXPERT = 6, 6


QUEUE_CAP = 5  # request rows per queue (running, waiting) that the actor reads
PER_TOKEN_CAP = 5.0  # seconds per token, in multiples of L, beyond which all is late
# Columns of a backend's packed rows beyond the features: when each request started,
# its tokens so far (at least 1), and whether the row holds a request.
_STARTED, _PER_TOKEN, _PRESENT = F_REQ, F_REQ + 1, F_REQ + 2


@dataclass(frozen=True, slots=True)
class ExpertSnapshot:
    """One expert's state: its memory use and its in-flight requests, oldest first,
    packed as [running, waiting] x QUEUE_CAP rows of eq. 6's features (column 5, the
    latency per token so far, is filled by `encode`, which knows L and the clock) plus
    when each request started, its tokens so far and a presence flag. `running` and
    `count` are the true numbers, which may exceed the rows kept."""

    memory: float  # e_{n,t}
    packed: np.ndarray  # [2, QUEUE_CAP, F_REQ + 3]
    running: int
    count: int
    token_latency: float = 0.0  # s per token of its recent requests (0: none yet)
    running_cap: int = 5
    waiting_cap: int = 5

    @property
    def waiting(self) -> int:
        return self.count - self.running


class _Cached(NamedTuple):
    view: BackendView
    requests: object
    kv_capacity_tokens: int
    batch: int
    snapshot: ExpertSnapshot


# A backend's view is rebuilt only when its load changes; between rebuilds the same
# object comes back and its snapshot holds as it is, and while its requests are the
# same tuple their packed rows hold.
FeatureCache = dict[str, _Cached]
# Backends come and go under new ids (pods restart): past this many the cache starts
# over rather than keep the gone ones for ever.
FEATURE_CACHE_CAP = 1024


TOKEN_LATENCY_WEIGHT = 0.2


def token_latency_mix(average: float, latest: float) -> float:
    """A backend's seconds per token over its recent requests (`BackendView.
    token_latency`): the latest finished request weighs TOKEN_LATENCY_WEIGHT; an
    average of 0 means none yet. The gateway and the simulator keep it alike."""
    if average == 0:
        return latest
    return (1 - TOKEN_LATENCY_WEIGHT) * average + TOKEN_LATENCY_WEIGHT * latest


def progress_share(tokens: float, running: int, inflight: int) -> float:
    """Each in-flight request's part of the `tokens` an engine generated between two
    scrapes of its metrics, when their answers are not streamed: the gateway cannot
    tell which of them ran, so every one of them is credited alike. The gateway and
    the simulator estimate progress alike."""
    return tokens / max(1, running, inflight)


def with_speed_prior(experts: Sequence[ExpertSnapshot]) -> Sequence[ExpertSnapshot]:
    """`experts` with each one whose seconds per token is not measured yet (0: it has
    finished no request) taken at the mean of those measured; unchanged while none is.
    An actor that reads an unmeasured engine as slow never sends it the request that
    would measure it, and can herd onto the one it measured first (docs/research.md,
    "A prior for unmeasured engines")."""
    measured = [e.token_latency for e in experts if e.token_latency > 0]
    if not measured or len(measured) == len(experts):
        return experts
    mean = sum(measured) / len(measured)
    return [e if e.token_latency > 0 else replace(e, token_latency=mean) for e in experts]


ARRIVALS_TAU = 10.0  # seconds: how far back the arrival rate looks (its decay's time constant)
LOAD_CAP = 10.0  # requests per second per candidate, beyond which the load reads the same


class Arrivals(NamedTuple):
    """Requests arriving, as an exponentially decaying count (`arrived`): `level` at
    `last` counts those after the first, which came at `since`. The gateway keeps one
    per model, the simulator one per episode, and both read the rate alike."""

    level: float = 0.0
    last: float = 0.0
    since: float | None = None

    def arrived(self, now: float, tau: float = ARRIVALS_TAU) -> Arrivals:
        """These arrivals with one more at `now`. A clock that steps back (replicas')
        decays nothing rather than grow the count."""
        if self.since is None:
            return Arrivals(0.0, now, now)
        decayed = self.level * math.exp(-max(0.0, now - self.last) / tau)
        return Arrivals(decayed + 1.0 / tau, max(now, self.last), self.since)

    def rate(self, tau: float = ARRIVALS_TAU) -> float:
        """Requests per second as of the last arrival, from those strictly between the
        first and the last: read just after an arrival, counting it would read high by
        one, as would counting the first, which only starts the clock. A decaying count
        started from nothing reads low until it has run for a few `tau`: it is divided
        by the share of its steady level it has had time to reach (at least a
        second's)."""
        if self.since is None:
            return 0.0
        reached = 1.0 - math.exp(-max(1.0, self.last - self.since) / tau)
        return max(0.0, self.level - 1.0 / tau) / reached

    def rate_at(self, now: float, tau: float = ARRIVALS_TAU) -> float:
        """`rate()` decayed from the last arrival to `now`, as the count would be had
        nothing arrived since: what a model whose traffic stopped fades to."""
        return self.rate(tau) * math.exp(-max(0.0, now - self.last) / tau)


# An empty row: no request (presence 0), one token so far so that dividing by it is safe.
_EMPTY_ROW = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0)


def _packed(b: BackendView, batch: int) -> np.ndarray:
    # Plain Python and one array at the end: on the request path numpy's per-call
    # work runs cold, and a dozen small operations cost more than these few rows.
    reqs = sorted(b.requests, key=lambda r: r.started_at)
    capacity = max(1, b.kv_capacity_tokens) if b.kv_capacity_tokens else 0

    def row(r: InflightRequest) -> tuple[float, ...]:
        g = r.generated
        return (
            r.prompt_tokens / 1000.0,
            r.pred_score,
            r.pred_length / MAX_TOKENS,
            (r.prompt_tokens + g) / capacity if capacity else 0.0,
            g / MAX_TOKENS,
            0.0,
            r.started_at,
            g if g > 1 else 1.0,
            1.0,
        )

    r = min(batch, QUEUE_CAP)
    w = max(0, min(len(reqs) - batch, QUEUE_CAP))
    running = [row(x) for x in reqs[:r]] + [_EMPTY_ROW] * (QUEUE_CAP - r)
    waiting = [row(x) for x in reqs[batch : batch + w]] + [_EMPTY_ROW] * (QUEUE_CAP - w)
    return np.array((running, waiting))


def snapshot(
    b: BackendView, stale_after: float, cache: FeatureCache | None = None
) -> ExpertSnapshot:
    """One backend's state: its in-flight requests, oldest first, with their progress.
    The oldest are the running batch: as many as the engine reports running when its
    figures are fresh, else up to the engine's batch cap (`max_batch`, its own
    setting, as the simulator's experts have theirs). `cache` keeps each backend's
    snapshot while its view is the same object, and its rows while its requests are."""
    found = cache.get(b.id) if cache is not None else None
    if found is not None and found.view is b:
        return found.snapshot
    fresh = b.stats_age <= stale_after
    count = len(b.requests)
    batch = min(b.running if fresh else b.max_batch, b.max_batch, count)
    if (
        found is not None
        and found.requests is b.requests
        and found.kv_capacity_tokens == b.kv_capacity_tokens
        and found.batch == batch
    ):
        packed = found.snapshot.packed
    else:
        packed = _packed(b, batch)
    snap = ExpertSnapshot(b.kv_usage, packed, batch, count, b.token_latency)
    if cache is not None:
        if found is None and len(cache) >= FEATURE_CACHE_CAP:
            cache.clear()
        cache[b.id] = _Cached(b, b.requests, b.kv_capacity_tokens, batch, snap)
    return snap


PREDICTION_COLUMN = 3  # of an expert's row: the arrived request's predicted score, then length


def expert_columns(
    e: ExpertSnapshot, latency_req: float, score: float = 0.0, length: float = 0.0
) -> tuple[float, ...]:
    """An expert's row of eq. 10's features (see the module's docstring), with the
    arrived request's predicted score and length (tokens) on it in columns
    PREDICTION_COLUMN and the next."""
    return (
        e.memory,
        e.running / e.running_cap,
        e.waiting / e.waiting_cap,
        score,
        length / MAX_TOKENS,
        min(PER_TOKEN_CAP, e.token_latency / latency_req),
    )


_EMPTY_PACKED = np.array(((_EMPTY_ROW,) * QUEUE_CAP,) * 2)


def encode(
    prompt_tokens: int,
    preds: Sequence[tuple[float, float]],
    experts: Sequence[ExpertSnapshot],
    latency_req: float,
    now: float,
    n_max: int | None = None,
    arrival_rate: float = 0.0,
) -> dict[str, np.ndarray]:
    """Dense, padded arrays for one decision at `now`. `preds[n]` is (score, length) on
    expert n; `arrival_rate` is the requests arriving per second (`Arrivals.rate`)."""
    n = len(experts)
    n_max = n_max or n
    pad = n_max - n
    k = max(1, len(preds))
    arrived = np.array(
        (
            prompt_tokens / 1000.0,
            sum(p[0] for p in preds) / k,
            sum(p[1] for p in preds) / k / MAX_TOKENS,
            0.0,
            0.0,
            0.0,
        ),
        np.float32,
    )
    ex = [expert_columns(e, latency_req, *p) for e, p in zip(experts, preds, strict=True)]
    ex += [(0.0,) * F_EXPERT] * pad
    # [N, 2 (running, waiting), QUEUE_CAP, F_REQ + 3], in float64 until the end; few
    # numpy calls, each over every backend at once (see `_packed`)
    packed = np.array([e.packed for e in experts] + [_EMPTY_PACKED] * pad).reshape(
        n_max, 2, QUEUE_CAP, F_REQ + 3
    )
    per_token = now - packed[..., _STARTED]
    np.maximum(per_token, 0.0, out=per_token)
    per_token /= packed[..., _PER_TOKEN]
    per_token /= latency_req  # in multiples of L
    np.minimum(per_token, PER_TOKEN_CAP, out=per_token)
    per_token *= packed[..., _PRESENT]
    packed[..., 5] = per_token
    return {
        "arrived": arrived,
        "experts": np.array(ex, np.float32).reshape(n_max, F_EXPERT),
        "queues": packed[..., :F_REQ].astype(np.float32),
        "expert_mask": np.array([1.0] * n + [0.0] * pad, np.float32),
        "queue_mask": packed[..., _PRESENT].astype(np.float32),
        "load": np.array((load_feature(arrival_rate, n),), np.float32),
    }


def load_feature(arrival_rate: float, candidates: int) -> float:
    """The load feature: requests arriving per second per candidate, capped."""
    return min(LOAD_CAP, arrival_rate / max(1, candidates))


INPUTS = ("arrived", "experts", "queues", "expert_mask", "queue_mask", "load")
