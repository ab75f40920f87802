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

__all__ = ["Engine", "Job", "finish_times"]


@dataclass(frozen=True)
class Engine:
    """The constants of an expert's iterations, as `edgeroute.sim.edge.EdgeExpert`."""

    base: float  # s per iteration
    k1: float  # s per prefill token
    k2: float  # s per context token in the decode batch
    memory_tokens: int
    running_cap: int


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
        t += engine.base + engine.k1 * sum(j.prompt for j in new)
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
            t += engine.base + engine.k1 * sum(j.prompt for j in new) + engine.k2 * context
            continue
        # Decode only until the next finish: m iterations whose context grows by one
        # token per running job each; the last one ends at the loop's next boundary.
        m = min(j.length - j.generated for j in run)
        t += m * engine.base + engine.k2 * (m * context + len(run) * m * (m - 1) / 2)
        for j in run:
            j.generated += m - 1


def _admit(engine: Engine, run: list[Job], queue: list[Job]) -> list[Job]:
    """Waiting jobs admitted at a boundary, in order, while a slot and KV memory last
    (the simulator's rule: the running jobs' tokens, the admitted ones', the next
    one's and one more must fit)."""
    new: list[Job] = []
    used = sum(j.tokens for j in run)
    while (
        queue
        and len(run) + len(new) < engine.running_cap
        and used + queue[0].tokens + 1 <= engine.memory_tokens
    ):
        job = queue.pop(0)
        used += job.tokens
        new.append(job)
    return new
