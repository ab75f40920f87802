"""A per-backend circuit breaker: closed, open after consecutive failures, half-open trial.

A circuit closes again only on evidence that the backend serves requests: once the
cool-down has passed it is half-open, and the next real request sent there is its
trial (other requests go elsewhere meanwhile). The trial's success closes it, its
failure opens it for another cool-down. A `/health` answer alone never closes it:
a backend can answer probes while it hangs on every completion.
"""

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
    trial: bool = False  # a half-open circuit's trial request is in flight

    def available(self, now: float) -> bool:
        """May a new request go there? An open circuit becomes half-open after its
        cool-down, and then takes one request at a time."""
        if self.state is State.OPEN and now - self.opened_at >= self.open_seconds:
            self.state = State.HALF_OPEN
            self.trial = False
        return self.state is State.CLOSED or (self.state is State.HALF_OPEN and not self.trial)

    def begin(self) -> bool:
        """A request was sent there; True when it is a half-open circuit's trial (the
        backend then takes nothing else until the trial ends)."""
        if self.state is State.HALF_OPEN and not self.trial:
            self.trial = True
            return True
        return False

    def abandon(self) -> bool:
        """A request there ended with no verdict (the client left); True when it was
        the trial, which the next request may then take."""
        if self.state is State.HALF_OPEN and self.trial:
            self.trial = False
            return True
        return False

    def success(self) -> None:
        self.state = State.CLOSED
        self.failures = 0
        self.trial = False

    def failure(self, now: float) -> bool:
        """Record a failure; True when this one opened the circuit."""
        self.failures += 1
        self.trial = False
        if self.state is State.HALF_OPEN or (
            self.state is State.CLOSED and self.failures >= self.failures_to_open
        ):
            self.state = State.OPEN
            self.opened_at = now
            return True
        if self.state is State.OPEN:
            self.opened_at = now
        return False

    def trip(self, now: float) -> bool:
        """Open now, whatever the count (the backend stalled); True when it was not open."""
        was_open = self.state is State.OPEN
        self.state = State.OPEN
        self.opened_at = now
        self.trial = False
        return not was_open
