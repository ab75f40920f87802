"""An edge expert's future when nothing more arrives: when each of its requests finishes.

The simulator's experts (`edgeroute.sim.edge`) run iteration-level batching: at each
iteration boundary the finished requests leave, waiting ones are admitted while slots
and KV memory allow, and the next iteration lasts base + k1 * (prefill tokens) + k2 *
(context tokens of the decode batch). With no arrivals the future is deterministic,
and between two boundaries where the batch changes every iteration is a decode step
whose cost grows by k2 per running request, so `finish_times` jumps from one change
to the next instead of stepping every token. Training uses it for the counterfactual
impact of a routing decision (the expert's future with and without the new request).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = ["Engine", "Job", "finish_times", "fits", "iteration_end"]


class Engine(Protocol):
    """The constants of an expert's iterations (`edgeroute.sim.edge.EdgeExpert` is one)."""

    @property
    def base(self) -> float: ...  # s per iteration
    @property
    def k1(self) -> float: ...  # s per prefill token
    @property
    def k2(self) -> float: ...  # s per context token in the decode batch
    @property
    def memory_tokens(self) -> int: ...
    @property
    def running_cap(self) -> int: ...


def iteration_end(engine: Engine, start: float, prefill_tokens: int, context_tokens: int) -> float:
    """When an iteration begun at `start` ends: the prefill of the admitted requests and a
    decode step of the batch."""
    return start + engine.base + engine.k1 * prefill_tokens + engine.k2 * context_tokens


def fits(engine: Engine, batch: int, used_tokens: int, tokens: int) -> bool:
    """Whether a waiting request of `tokens` is admitted beside a batch of `batch`
    requests holding `used_tokens` of KV: a free slot, and its tokens and one more fit."""
    return batch < engine.running_cap and used_tokens + tokens + 1 <= engine.memory_tokens


@dataclass
class Job:
    """A request on the expert: its prompt, tokens generated so far and its (true) length."""

    key: int
    prompt: int
    generated: int
    length: int

    @property
    def tokens(self) -> int:
        return self.prompt + self.generated


def finish_times(
    engine: Engine,
    running: Sequence[Job],
    fresh: Sequence[Job],
    waiting: Sequence[Job],
    clock: float,
    now: float,
) -> dict[int, float]:
    """When each job finishes (by `key`), if nothing more arrives. `running` and `fresh`
    (admitted, prefill in flight) form the iteration that ends at `clock`; `waiting`
    is in admission order. An idle expert (no running or fresh jobs) admits at
    max(clock, now), as the simulator does. The jobs given are copied, not changed."""
    run = [Job(j.key, j.prompt, j.generated, j.length) for j in running]
    new = [Job(j.key, j.prompt, j.generated, j.length) for j in fresh]
    queue = [Job(j.key, j.prompt, j.generated, j.length) for j in waiting]
    done: dict[int, float] = {}
    t = clock
    if not run and not new:
        t = max(clock, now)
        new = _admit(engine, run, queue)
        if not new:
            return done
        t = iteration_end(engine, t, sum(j.prompt for j in new), 0)
    while True:
        # The iteration ending at t had run + new in its batch: each gets a token.
        run.extend(new)
        for j in run:
            j.generated += 1
            if j.generated >= j.length:
                done[j.key] = t
        run = [j for j in run if j.key not in done]
        new = _admit(engine, run, queue)
        if not run and not new:
            return done
        context = sum(j.tokens for j in run)
        if new:
            t = iteration_end(engine, t, sum(j.prompt for j in new), context)
            continue
        # Decode only until the next finish: m iterations whose context grows by one
        # token per running job each; the last one ends at the loop's next boundary.
        m = min(j.length - j.generated for j in run)
        t += m * engine.base + engine.k2 * (m * context + len(run) * m * (m - 1) / 2)
        for j in run:
            j.generated += m - 1


def _admit(engine: Engine, run: list[Job], queue: list[Job]) -> list[Job]:
    """Waiting jobs admitted at a boundary, in order, while they `fit`."""
    new: list[Job] = []
    used = sum(j.tokens for j in run)
    while queue and fits(engine, len(run) + len(new), used, queue[0].tokens):
        job = queue.pop(0)
        used += job.tokens
        new.append(job)
    return new
