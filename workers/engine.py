"""An iteration-level (continuous batching) engine on an emulated clock.

Each iteration the scheduler (1) reserves the next token's KV slot for every
running sequence, preempting the most recently admitted ones when memory runs
out (they are recomputed later, as vLLM does), (2) admits waiting sequences
first-come-first-served while their KV fits, within the batch and prefill-token
budgets, and (3) charges the iteration `base + k1*prefill + k2*decode context`.
Newly admitted sequences emit their first token at the end of the iteration,
running ones their next.

The engine keeps its own clock. While it works, the clock moves by each
iteration's duration, however late the host runs the iteration, so every token's
emulated time is the profile's, on a loaded machine as on an idle one; while it is
idle, the clock follows the wall clock. `speedup` runs the same timeline faster
than the wall clock: an iteration of `dt` emulated seconds takes `dt / speedup` wall
seconds. Deadlines are absolute, so sleep jitter does not accumulate; how late the
host ran is `stats.lag_max` (and `bench worker-capacity` measures it).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from policies.prefix_cache import PrefixCache, skipped
from workers.profiles import EngineProfile

log = logging.getLogger("edgeroute.worker")

_order = itertools.count()


class EngineError(Exception):
    """A sequence that cannot run at all (it would never fit in memory)."""


@dataclass(eq=False)
class Sequence:
    """One request inside the engine. Token indices arrive on `tokens`; None ends it."""

    id: str
    prompt_tokens: int
    target_tokens: int
    prefix_hashes: tuple[int, ...] = ()
    remote_cached_tokens: int = 0
    task: str = ""  # the request class (MoE activation statistics are kept per class)
    arrival: float = 0.0
    generated: int = 0
    blocks: int = 0
    cached_tokens: int = 0
    first_token_at: float | None = None
    last_token_at: float | None = None
    admitted_at: float | None = None
    preemptions: int = 0
    cancelled: bool = False
    error: str | None = None
    order: int = field(default_factory=lambda: next(_order))
    tokens: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)

    @property
    def context(self) -> int:
        return self.prompt_tokens + self.generated

    @property
    def finished(self) -> bool:
        return self.generated >= self.target_tokens


@dataclass
class Plan:
    """What one iteration does."""

    prefill: list[Sequence]
    decode: list[Sequence]
    prefill_tokens: int
    decode_context: int

    @property
    def empty(self) -> bool:
        return not self.prefill and not self.decode


@dataclass
class EngineStats:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    preemptions: int = 0
    finished: int = 0
    iterations: int = 0
    lag_max: float = 0.0


Observer = Callable[[str, Sequence, float], None]


class Engine:
    def __init__(
        self,
        profile: EngineProfile,
        speedup: float = 1.0,
        observer: Observer | None = None,
        extra_cost: Callable[[Plan], float] | None = None,
    ) -> None:
        if speedup <= 0:
            raise ValueError("speedup must be > 0")
        self.profile = profile
        self.speedup = speedup
        self.extra_cost = extra_cost  # e.g. remote MoE expert calls, per iteration
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.free_blocks = profile.kv_blocks
        self.prefix_cache = PrefixCache(profile.kv_blocks)
        self.stats = EngineStats()
        # Called with ("first_token" | "token" | "finished", seq, the engine's clock).
        self.observers: list[Observer] = [observer] if observer is not None else []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._t0 = time.monotonic()
        self._clock = 0.0  # emulated seconds at the end of the last iteration
        self._busy = False  # iterating (the clock moves by iterations, not the wall)

    # -- clock ---------------------------------------------------------------

    def wall(self) -> float:
        """Emulated seconds since the engine started, by the wall clock."""
        return (time.monotonic() - self._t0) * self.speedup

    def now(self) -> float:
        """The engine's clock: while it iterates, where the last iteration ended (a
        request arriving mid-iteration is stamped with its start), else the wall's."""
        if self._busy:
            return self._clock
        return max(self._clock, self.wall())

    # -- public API ----------------------------------------------------------

    @property
    def kv_usage(self) -> float:
        return 1.0 - self.free_blocks / self.profile.kv_blocks

    def submit(self, seq: Sequence) -> None:
        if self.profile.blocks_for(seq.prompt_tokens + seq.target_tokens) > self.profile.kv_blocks:
            raise EngineError(
                f"request needs {seq.prompt_tokens + seq.target_tokens} tokens of KV cache; "
                f"this engine holds {self.profile.kv_blocks * self.profile.block_size}"
            )
        seq.arrival = self.now()
        self.waiting.append(seq)
        self._wake.set()

    def cancel(self, seq: Sequence) -> None:
        seq.cancelled = True
        self._wake.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for seq in [*self.running, *self.waiting]:
            seq.error = "engine stopped"
            seq.tokens.put_nowait(None)
        self.running.clear()
        self.waiting.clear()

    # -- scheduling (synchronous, testable without a clock) -------------------

    def schedule(self) -> Plan:
        self._drop_cancelled()
        self._reserve_decode_slots()
        decode = list(self.running)
        prefill = self._admit()
        return Plan(
            prefill=prefill,
            decode=decode,
            prefill_tokens=sum(s.context - s.cached_tokens for s in prefill),
            decode_context=sum(s.context for s in decode),
        )

    def complete(self, plan: Plan, now: float) -> None:
        """Apply an iteration's outcome: one token for every sequence in it."""
        self.stats.iterations += 1
        for seq in [*plan.prefill, *plan.decode]:
            if seq.cancelled:
                continue
            seq.generated += 1
            self.stats.generation_tokens += 1
            if seq.first_token_at is None:
                seq.first_token_at = now
                self._observe("first_token", seq, now)
            else:
                self._observe("token", seq, now)
            seq.last_token_at = now
            seq.tokens.put_nowait(seq.generated)
            if seq.finished:
                self._release(seq)
                self.running.remove(seq)
                self.stats.finished += 1
                self._observe("finished", seq, now)
                seq.tokens.put_nowait(None)

    def _drop_cancelled(self) -> None:
        for seq in [s for s in self.running if s.cancelled]:
            self._release(seq)
            self.running.remove(seq)
            seq.tokens.put_nowait(None)
        if any(s.cancelled for s in self.waiting):
            for seq in [s for s in self.waiting if s.cancelled]:
                seq.tokens.put_nowait(None)
            self.waiting = deque(s for s in self.waiting if not s.cancelled)

    def _reserve_decode_slots(self) -> None:
        for seq in sorted(self.running, key=lambda s: s.order):
            if seq not in self.running:
                continue  # preempted while making room for an earlier one
            need = self.profile.blocks_for(seq.context + 1) - seq.blocks
            while need > self.free_blocks:
                victim = max(self.running, key=lambda s: s.order)
                self._preempt(victim)
                if victim is seq:
                    break
            else:
                self.free_blocks -= need
                seq.blocks += need

    def _preempt(self, seq: Sequence) -> None:
        self._release(seq)
        self.running.remove(seq)
        seq.preemptions += 1
        seq.cached_tokens = 0
        self.stats.preemptions += 1
        self.waiting.appendleft(seq)
        log.info("preempted %s (%d tokens) to free KV memory", seq.id, seq.context)

    def _admit(self) -> list[Sequence]:
        admitted: list[Sequence] = []
        budget = self.profile.max_batched_tokens
        while self.waiting and len(self.running) < self.profile.max_batch:
            seq = self.waiting[0]
            need = self.profile.blocks_for(seq.context + 1)
            if need > self.free_blocks:
                break
            local_hit, cached = self.cached_prefix(seq)
            prefill = seq.context - cached
            if admitted and prefill > budget:
                break
            self.waiting.popleft()
            self.stats.prefix_queries += seq.prompt_tokens
            self.stats.prefix_hits += local_hit
            self.free_blocks -= need
            seq.blocks = need
            seq.cached_tokens = cached
            seq.admitted_at = self.now() if seq.admitted_at is None else seq.admitted_at
            budget -= prefill
            self.stats.prompt_tokens += prefill
            self.running.append(seq)
            admitted.append(seq)
            self.prefix_cache.remember(seq.prefix_hashes)
        return admitted

    def cached_prefix(self, seq: Sequence) -> tuple[int, int]:
        """(tokens hit in the local prefix cache, tokens whose prefill is skipped)."""
        local = self.prefix_cache.hit(seq.prefix_hashes) * self.profile.block_size
        return local, skipped(max(local, seq.remote_cached_tokens), seq.context)

    def _release(self, seq: Sequence) -> None:
        self.free_blocks += seq.blocks
        seq.blocks = 0

    def _observe(self, event: str, seq: Sequence, now: float) -> None:
        for observer in self.observers:
            observer(event, seq, now)

    # -- the clock loop ------------------------------------------------------

    def _resume(self) -> None:
        """After idling: the clock moves on to when the first waiting request came, as
        an idle engine would have started on it at once."""
        came = min((seq.arrival for seq in self.waiting), default=self.wall())
        self._clock = max(self._clock, came)
        self._busy = True

    async def _run(self) -> None:
        deadline = time.monotonic()
        self._resume()
        while True:
            if not self.running and not self.waiting:
                self._busy = False
                self._wake.clear()
                await self._wake.wait()
                deadline = time.monotonic()
                self._resume()
            plan = self.schedule()
            if plan.empty:
                # Nothing runnable (all cancelled): wait for the next change.
                self._busy = False
                self._wake.clear()
                if not self.running and self.waiting:
                    await self._wake.wait()
                deadline = time.monotonic()
                self._resume()
                continue
            dt = self.profile.iteration_time(plan.prefill_tokens, plan.decode_context)
            if self.extra_cost is not None:
                dt += self.extra_cost(plan)
            deadline += dt / self.speedup
            delay = deadline - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                self.stats.lag_max = max(self.stats.lag_max, -delay * self.speedup)
                if delay < -0.05:
                    deadline = time.monotonic()  # too far behind: do not burst to catch up
                await asyncio.sleep(0)
            self._clock += dt
            self.complete(plan, self._clock)


@dataclass(frozen=True)
class Timeline:
    """When one sequence's first and last tokens came, in emulated seconds."""

    first: float
    last: float
    tokens: int

    @property
    def mean_itl(self) -> float:
        return (self.last - self.first) / (self.tokens - 1) if self.tokens > 1 else 0.0


def replay(profile: EngineProfile, seqs: list[Sequence]) -> list[Timeline]:
    """The profile's prediction: `seqs`, all arriving at t=0, run without a clock."""
    engine = Engine(profile)
    for seq in seqs:
        engine.submit(seq)
    now = 0.0
    while not (plan := engine.schedule()).empty:
        now += profile.iteration_time(plan.prefill_tokens, plan.decode_context)
        engine.complete(plan, now)
    return [Timeline(s.first_token_at or 0.0, s.last_token_at or 0.0, s.generated) for s in seqs]
