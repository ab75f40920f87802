"""An edge expert's future: when each of its requests finishes.

The simulator's experts (`edgeroute.sim.edge`) run iteration-level batching: at each
iteration boundary the finished requests leave, waiting ones are admitted while slots
and KV memory allow, and the next iteration lasts base + k1 * (prefill tokens) + k2 *
(context tokens of the decode batch). Given the requests there and those still to
arrive the future is deterministic, and between two boundaries where the batch changes
(a finish, an admission, an arrival) every iteration is a decode step whose cost grows
by k2 per running request, so `finish_times` jumps from one change to the next instead
of stepping every token. Training uses it for the true impact of a routing decision:
the expert's future with and without the new request, with nothing more arriving
("counterfactual") or with the requests that did arrive while it was there
("hindsight").
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = ["Engine", "Job", "alone_latency", "finish_times", "fits", "iteration_end"]


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


def alone_latency(engine: Engine, prompt_tokens: int, length: int, cached: bool) -> float:
    """A request's latency per output token on `engine` with nothing else there: its
    prefill (one token if `cached`, else the whole prompt) in the first iteration, which
    yields its first token, then one iteration per further token, each reading its
    context so far. No batch or queue makes it sooner (others only add to an
    iteration, a queue only delays it)."""
    prefill = 1 if cached else prompt_tokens
    context = (length - 1) * prompt_tokens + length * (length - 1) // 2
    total = length * engine.base + engine.k1 * prefill + engine.k2 * context
    return total / length


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
    arrivals: Sequence[tuple[float, Job]] = (),
) -> dict[int, float]:
    """When each job finishes (by `key`). `running` and `fresh` (admitted, prefill in
    flight) form the iteration that ends at `clock`; `waiting` is in admission order;
    `arrivals` join the waiting queue at their times (after `now`, in order), as the
    simulator's arrivals do: one that comes while an iteration runs waits for its end,
    one that finds the expert idle starts an iteration at once. An idle expert with
    jobs waiting starts at max(clock, now). The jobs given are copied, not changed."""
    run = [Job(j.key, j.prompt, j.generated, j.length) for j in running]
    new = [Job(j.key, j.prompt, j.generated, j.length) for j in fresh]
    queue = [Job(j.key, j.prompt, j.generated, j.length) for j in waiting]
    later = deque((a, Job(j.key, j.prompt, j.generated, j.length)) for a, j in arrivals)
    done: dict[int, float] = {}
    t = clock
    while True:
        if not run and not new:  # idle: the next work starts an iteration
            if queue:
                t = max(t, now)
            elif later:
                a, job = later.popleft()
                queue.append(job)
                t = max(t, a)
            new = _admit(engine, run, queue)
            if not new:
                return done
            t = iteration_end(engine, t, sum(j.prompt for j in new), 0)
        # The iteration ending at t had run + new in its batch: each gets a token, and
        # whoever arrived while it ran is waiting at its end.
        while later and later[0][0] < t:
            queue.append(later.popleft()[1])
        run.extend(new)
        for j in run:
            j.generated += 1
            if j.generated >= j.length:
                done[j.key] = t
        run = [j for j in run if j.key not in done]
        new = _admit(engine, run, queue)
        context = sum(j.tokens for j in run)
        if new:
            t = iteration_end(engine, t, sum(j.prompt for j in new), context)
            continue
        if not run:
            continue  # idle
        # Decode only, until the next finish or the boundary after the next arrival:
        # iteration i (from 1) ends i * base + k2 * (i * context + len(run) * i(i-1)/2)
        # from now; the last of the m ends at the loop's next boundary.
        m = min(j.length - j.generated for j in run)
        if later:
            m = min(m, _iterations_until(engine, later[0][0] - t, context, len(run)))
        t += m * engine.base + engine.k2 * (m * context + len(run) * m * (m - 1) / 2)
        for j in run:
            j.generated += m - 1


def _iterations_until(engine: Engine, span: float, context: int, batch: int) -> int:
    """The fewest decode iterations (at least 1) whose ends pass `span` from now."""
    i, elapsed = 0, 0.0
    while True:
        i += 1
        elapsed += engine.base + engine.k2 * (context + batch * (i - 1))
        if elapsed > span:
            return i


def _admit(engine: Engine, run: list[Job], queue: list[Job]) -> list[Job]:
    """Waiting jobs admitted at a boundary, in order, while they `fit`."""
    new: list[Job] = []
    used = sum(j.tokens for j in run)
    while queue and fits(engine, len(run) + len(new), used, queue[0].tokens):
        job = queue.pop(0)
        used += job.tokens
        new.append(job)
    return new
