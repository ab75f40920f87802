"""Lifecycle hooks: called around every attempt, failed ones included."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from gateway.hooks import Dispatch, Outcome

Start = Callable[..., tuple[str, Any]]
CHAT = "/v1/chat/completions"
MODEL = "mistral-7b-chat"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str | None]] = []

    def dispatched(self, d: Dispatch) -> None:
        self.events.append(("dispatched", d.backend.id, None))

    def first_byte(self, d: Dispatch) -> None:
        self.events.append(("first_byte", d.backend.id, None))

    def ended(self, d: Dispatch, outcome: Outcome | None) -> None:
        self.events.append(("ended", d.backend.id, outcome.status if outcome else None))


def test_hooks_see_a_failed_attempt_then_the_one_that_answers(
    start_worker: Start, start_gateway: Start
) -> None:
    flaky_url, flaky = start_worker(enable_faults=True)
    steady_url, _ = start_worker()
    url, gw = start_gateway(
        [{"url": flaky_url, "id": "flaky"}, {"url": steady_url, "id": "steady"}],
        routing={"default": {"policy": "round_robin"}},
    )
    recorder = Recorder()
    gw.add_hook(recorder)
    flaky.config.fault.mode = "error"
    r = httpx.post(url + CHAT, json=BODY, timeout=10)  # round-robin's first: flaky
    assert r.status_code == 200 and r.headers["x-edgeroute-backend"] == "steady"
    assert recorder.events == [
        ("dispatched", "flaky", None),
        ("ended", "flaky", None),  # failed before answering: no outcome
        ("dispatched", "steady", None),
        ("first_byte", "steady", None),
        ("ended", "steady", "200"),
    ]
    # A stream's attempt ends when the stream has ended, with the status sent.
    recorder.events.clear()
    flaky.config.fault.mode = "none"
    with httpx.stream("POST", url + CHAT, json={**BODY, "stream": True}, timeout=10) as s:
        assert s.status_code == 200
        s.read()
    kinds = [e[0] for e in recorder.events]
    assert kinds == ["dispatched", "first_byte", "ended"] and recorder.events[-1][2] == "200"
