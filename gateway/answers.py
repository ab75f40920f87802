"""Answering the client: the response's headers, the relay of a stream, and each
request's accounting when it ends (metrics, the backend's in-flight count, hooks).

A whole answer is sent as received. A stream is relayed chunk by chunk, its framing
checked as it goes; a backend that breaks it or goes silent ends the stream with an
OpenAI-style error event, never with a silent truncation.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator
from typing import Any

from starlette.responses import Response

from gateway.backends import BackendPool
from gateway.errors import GatewayError
from gateway.forwarding import REASONS, Upstream
from gateway.hooks import Outcome
from gateway.metrics import GatewayMetrics, series
from gateway.relay import RelayResponse
from gateway.upstream import UpstreamError

log = logging.getLogger("edgeroute.answers")

_DROP_DOWN = frozenset(
    b"content-length connection keep-alive transfer-encoding te trailer upgrade "
    b"proxy-connection date server".split()
)


class Answers:
    """Turns a backend's answer into the client's response, and accounts for it."""

    def __init__(self, pool: BackendPool, metrics: GatewayMetrics, idle: float) -> None:
        """`idle`: the longest gap a stream may leave between chunks."""
        self.pool = pool
        self.metrics = metrics
        self._idle = idle

    def respond(
        self,
        up: Upstream,
        model: str,
        rid: str,
        t0: float,
        t_sent: float,
        t_back: float,
        stream: bool,
        upstream_wait: float = 0.0,
    ) -> Response | RelayResponse:
        """`upstream_wait`: time already spent on other backends' answers (a prefill),
        which is not the gateway's own overhead."""
        b = up.backend
        if up.response.status < 500:
            self.pool.succeeded(b)
        headers = [(k, v) for k, v in up.response.raw_headers if k.lower() not in _DROP_DOWN]
        headers.append((b"x-edgeroute-backend", b.id.encode()))
        headers.append((b"x-request-id", rid.encode("ascii")))
        status = up.response.status
        overhead = (t_sent - t0) - upstream_wait + (time.perf_counter() - t_back)
        headers.append((b"x-edgeroute-overhead-ms", f"{overhead * 1000:.3f}".encode()))
        self.metrics.overhead.observe(overhead)
        if not up.streaming:
            headers.append((b"content-length", str(len(up.first)).encode()))
            tokens = _completion_tokens(up.answer) if status == 200 else 0
            self.finished(up, model, str(status), t0, tokens)
            return Raw(status, headers, up.first)
        series(self.metrics.ttft, model, b.id).observe(t_back - t0)
        relay = self._relay(up, model, t0, t_back)
        return RelayResponse(status, headers, relay, up.response.ended)

    async def _relay(
        self, up: Upstream, model: str, t0: float, t_first: float
    ) -> AsyncGenerator[bytes, None]:
        b = up.backend
        status = str(up.response.status)
        itl = series(self.metrics.itl, model, b.id)
        last = t_first
        response = up.response
        events = up.events
        assert events is not None
        entry = up.entry
        clean = False
        try:
            if up.first:
                clean = response.ended()
                yield up.first
            while not clean:
                chunk = await response.readany(self._idle)
                if not chunk:
                    if not events.finish():
                        raise _NotSSE
                    clean = True
                    break
                now = time.perf_counter()
                itl.observe(now - last)
                last = now
                b.progress_at = time.monotonic()
                if not events.feed(chunk):
                    raise _NotSSE
                if entry is not None:
                    entry.generated = events.data_events
                clean = response.ended()  # RelayResponse ends the stream with this one
                if clean and not events.finish():
                    raise _NotSSE
                yield chunk
        except (UpstreamError, TimeoutError, _NotSSE) as exc:
            clean = False
            status = "502"
            if isinstance(exc, TimeoutError):
                reason = "went silent"
            elif isinstance(exc, _NotSSE):
                reason = "sent bytes that are not server-sent events"
            else:
                reason = REASONS.get(exc.reason, "failed")
            self.pool.failed(b)
            log.warning("backend %s %s mid-stream", b.id, reason)
            err = GatewayError(
                502,
                f"backend {b.id} {reason} mid-stream; the response is incomplete",
                code="upstream_error",
            )
            yield err.sse_event()
        except (GeneratorExit, asyncio.CancelledError):
            if not clean:
                status = "499"  # the client left
            raise
        finally:
            if clean:
                up.response.release()
            else:
                up.response.close()  # the backend sees the disconnect and stops
            self.finished(up, model, status, t0, events.tokens)

    def finished(self, up: Upstream, model: str, status: str, t0: float, tokens: int) -> None:
        """Account for a request that has ended, well or not, on `up.backend`."""
        b = up.backend
        elapsed = time.perf_counter() - t0
        self.pool.finished(b, up.entry)
        if status == "200":
            self.pool.finished_tokens(b, elapsed, tokens)
        series(self.metrics.requests, model, up.path, b.id, status).inc()
        series(self.metrics.e2e, model, b.id).observe(elapsed)
        if tokens:
            series(self.metrics.output_tokens, model, b.id).inc(tokens)
        self.ended(up, Outcome(status, tokens, elapsed))

    @staticmethod
    def ended(up: Upstream, outcome: Outcome) -> None:
        if up.dispatch is not None:
            for hook in up.hooks:
                hook.ended(up.dispatch, outcome)


class _NotSSE(Exception):
    """A stream's bytes broke the server-sent-events framing."""


def _completion_tokens(answer: Any) -> int:
    """The answer's `usage.completion_tokens`, or 0."""
    usage = answer.get("usage") if isinstance(answer, dict) else None
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else 0


class Raw(Response):
    """A response whose headers are already raw pairs."""

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.status_code = status
        self.body = body
        self.raw_headers = headers
        self.background = None
