"""A per-backend circuit breaker: closed, open after consecutive failures, half-open probe."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class State(enum.IntEnum):
    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


@dataclass
class Circuit:
    failures_to_open: int = 3
    open_seconds: float = 5.0
    state: State = State.CLOSED
    failures: int = 0
    opened_at: float = 0.0

    def available(self, now: float) -> bool:
        """May new requests go there? An open circuit becomes half-open after its cool-down."""
        if self.state is State.OPEN and now - self.opened_at >= self.open_seconds:
            self.state = State.HALF_OPEN
        return self.state is not State.OPEN

    def success(self) -> None:
        self.state = State.CLOSED
        self.failures = 0

    def failure(self, now: float) -> bool:
        """Record a failure; True when this one opened the circuit."""
        self.failures += 1
        if self.state is State.HALF_OPEN or (
            self.state is State.CLOSED and self.failures >= self.failures_to_open
        ):
            self.state = State.OPEN
            self.opened_at = now
            return True
        if self.state is State.OPEN:
            self.opened_at = now
        return False
