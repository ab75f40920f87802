"""A validated request on its way to a backend, and what routing reads of it."""

from __future__ import annotations

import itertools
import random
import time
from dataclasses import dataclass
from typing import Any

from gateway.arrivals import ArrivalCounts
from policies.text import block_hashes, estimate_tokens, prompt_text, stable_hash
from policies.types import RequestInfo


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs on every request
class Incoming:
    """A request the proxy has accepted: its body checked, its model known."""

    hdrs: dict[bytes, bytes]  # the client's headers, names lower-case
    path: str  # the endpoint's: /v1/chat/completions, /v1/completions, /v1/embeddings
    raw: bytes  # the body as the client sent it
    body: dict[str, Any]  # the body, parsed and validated
    headers: list[tuple[bytes, bytes]]  # the headers to send upstream
    model: str
    rid: str  # the request id, echoed to the client and sent upstream
    t0: float  # perf_counter() when it arrived


def header_text(hdrs: dict[bytes, bytes], name: bytes) -> str | None:
    """A request header's value as text (latin-1, as HTTP/1.1 carries it), or None."""
    value = hdrs.get(name)
    return value.decode("latin-1") if value is not None else None


class RequestInfos:
    """Builds the `RequestInfo` a policy reads: the prompt's size, its prefix blocks
    and its model's arrival rate when a policy needs them, the session, and the
    request's draw of randomness."""

    def __init__(self, prefix_block_tokens: int, arrivals: ArrivalCounts) -> None:
        self.prefix_block_tokens = prefix_block_tokens
        self.arrivals = arrivals
        self._seq = itertools.count()

    def build(self, req: Incoming, hashed: bool, counted: bool = False) -> RequestInfo:
        """`hashed`: work out the prompt's block hashes (Need.BLOCK_HASHES); `counted`:
        count it among its model's arrivals and give their rate (Need.ARRIVAL_RATE)."""
        body = req.body
        text = prompt_text(body)
        session = header_text(req.hdrs, b"x-session-id") or body.get("user")
        now = time.monotonic()
        return RequestInfo(
            model=req.model,
            prompt_tokens=estimate_tokens(text),
            block_hashes=block_hashes(text, self.prefix_block_tokens) if hashed else (),
            max_tokens=body.get("max_completion_tokens") or body.get("max_tokens"),
            session_hash=stable_hash(session) if isinstance(session, str) and session else None,
            seq=next(self._seq),
            entropy=random.getrandbits(63),
            now=now,
            stream=bool(body.get("stream")),
            task=header_text(req.hdrs, b"x-edgeroute-task"),
            prompt=text,
            arrival_rate=self.arrivals.arrived(req.model, now) if counted else 0.0,
        )
