"""Forwarding with retries: decide, send, and walk the policy's ranking on failure.

A request goes to the backend its policy decided on. If that attempt fails before
any byte has reached the client (unreachable, 5xx or 429, timeout, an answer that is
not JSON or not server-sent events, another request's answer), it goes to the next
backend of the same snapshot's ranking, up to `retries` times. When the ranking is
exhausted the last failure stands: a 502 or 504 by construction.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.backends import Backend, BackendPool, InflightEntry
from gateway.errors import GatewayError
from gateway.hooks import Dispatch, Hook
from gateway.metrics import GatewayMetrics, series
from gateway.settings import Settings
from gateway.sse import SSEScanner
from gateway.upstream import Attempt, UpstreamError, UpstreamPool, UpstreamResponse
from policies.pipeline import Policy
from policies.types import ClusterView, Decision, RequestInfo

log = logging.getLogger("edgeroute.forwarding")

REASONS = {
    "connect": "is unreachable",
    "broken": "broke the exchange",
    "headers_too_large": "sent response headers over the gateway's limits",
    "body_too_large": "sent a response body over the gateway's limit",
    "stalled": "stalled (no progress while peers answered)",
}


@dataclass
class Upstream:
    """A backend's answer, received up to the point where it can still be retried."""

    backend: Backend
    response: UpstreamResponse
    first: bytes  # the first body chunk (stream) or the whole body
    streaming: bool  # more chunks may follow `first`
    path: str  # the endpoint's, as the client asked it and the backend was sent it
    entry: InflightEntry | None = None
    events: SSEScanner | None = None  # a stream's framing check and token count
    answer: Any = None  # a whole 2xx answer, parsed once (it must be JSON)
    dispatch: Dispatch | None = None  # the attempt that got this answer, for the hooks
    hooks: tuple[Hook, ...] = ()


class Retryable(Exception):
    def __init__(self, error: GatewayError, reason: str) -> None:
        super().__init__(error.message)
        self.error = error
        self.reason = reason


class Forwarder:
    """Sends a request where its policy says, retrying along the policy's ranking."""

    def __init__(
        self,
        settings: Settings,
        pool: BackendPool,
        upstream: UpstreamPool,
        metrics: GatewayMetrics,
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.upstream = upstream
        self.metrics = metrics
        # The gateway's hooks, called around every attempt of every request.
        self.hooks: tuple[Hook, ...] = ()
        # `first_byte` bounds a stream's wait for its first event, `response` the wait
        # for a whole answer.
        self._first_byte = settings.timeouts.first_byte
        self._response = settings.timeouts.response
        # When the last decision ended (perf_counter), and an event set at every
        # decision: `gateway.warmth` reads the one and waits for the other.
        self.decided_at = 0.0
        self.decided = asyncio.Event()

    async def forward(
        self,
        pipeline: Policy,
        info: RequestInfo,
        path: str,
        raw: bytes,
        headers: list[tuple[bytes, bytes]],
        model: str,
        rid: str,
        *,
        stream: bool | None = None,
        hooks: tuple[Hook, ...] = (),
    ) -> tuple[Upstream, float]:
        """Pick a backend and send; on failure before any byte is relayed, try another.

        Returns the backend's answer and when it was sent. `hooks` are this request's
        own, called after the gateway's.
        """
        hooks = self.hooks + hooks
        s = self.settings
        stream = info.stream if stream is None else stream
        view = self.pool.view
        t_decide = time.perf_counter()
        first = pipeline.decide(info, view)
        # Taken before the series lookup below, which is not the policy's time.
        self.decided_at = time.perf_counter()
        self.decided.set()
        decided_in = self.decided_at - t_decide
        series(self.metrics.decision, pipeline.name).observe(decided_in)
        if first.backend_id is None:
            qos = first.token_target is not None
            why = "qos" if qos else first.rejected_by or "no_backend"
            series(self.metrics.shed, model, why).inc()
            if qos:
                series(self.metrics.qos_requests, "shed").inc()
            raise GatewayError(
                503,
                f"no backend can take this request: {first.reason}",
                code="no_capacity",
                retry_after=s.retry_after,
            )
        last: Retryable | None = None
        # The ranking, walked: a failure before any byte reached the client moves on to
        # the next backend, up to `retries` times; past its end, the last failure stands.
        for decision in itertools.islice(_ranking(pipeline, info, view, first), 1 + s.retries):
            backend = self.pool.get(decision.backend_id or "")
            if backend is None:
                continue  # removed since the decision
            series(self.metrics.decisions, pipeline.name, backend.id).inc()
            score, length = decision.predicted or (0.0, 0.0)
            entry = InflightEntry(
                info.prompt_tokens,
                info.now or time.monotonic(),
                pred_score=score,
                pred_length=length,
                token_target=decision.token_target,
                streamed=stream,
            )
            self.pool.dispatched(backend, info.block_hashes, entry)
            # Only built when there are hooks to call: most requests have none.
            dispatch = Dispatch(info, decision, backend, model, rid) if hooks else None
            if dispatch is not None:
                for hook in hooks:
                    hook.dispatched(dispatch)
            t_sent = time.perf_counter()
            try:
                up = await self._open(backend, path, raw, headers, stream)
            except Retryable as exc:
                self.pool.finished(backend, entry)
                if dispatch is not None:
                    for hook in hooks:
                        hook.ended(dispatch, None)
                if self.pool.failed(backend):
                    log.warning("backend %s circuit open after: %s", backend.id, exc.reason)
                series(self.metrics.retries, backend.id, exc.reason).inc()
                last = exc
                continue
            except asyncio.CancelledError:  # the client left
                self.pool.finished(backend, entry)
                if dispatch is not None:
                    for hook in hooks:
                        hook.ended(dispatch, None)
                series(self.metrics.requests, model, path, backend.id, "499").inc()
                raise
            up.entry = entry
            if dispatch is not None:
                up.dispatch = dispatch
                up.hooks = hooks
                for hook in hooks:
                    hook.first_byte(dispatch)
            return up, t_sent
        if last is None:  # every ranked backend was removed meanwhile
            raise GatewayError(
                503,
                "no backend can take this request",
                code="no_capacity",
                retry_after=s.retry_after,
            )
        raise last.error

    async def _open(
        self,
        backend: Backend,
        path: str,
        raw: bytes,
        headers: list[tuple[bytes, bytes]],
        stream: bool,
    ) -> Upstream:
        authorization = backend.config.authorization()
        if authorization is not None:
            headers = [(k, v) for k, v in headers if k != b"authorization"]
            headers.append((b"authorization", authorization.encode("latin-1")))
        wait = self._first_byte if stream else self._response
        attempt = Attempt(time.monotonic(), stream)
        backend.pending.add(attempt)
        try:
            return await self._exchange(backend, path, raw, headers, stream, wait, attempt)
        finally:
            backend.pending.discard(attempt)

    async def _exchange(
        self,
        backend: Backend,
        path: str,
        raw: bytes,
        headers: list[tuple[bytes, bytes]],
        stream: bool,
        wait: float,
        attempt: Attempt,
    ) -> Upstream:
        bid = backend.id
        try:
            resp = await self.upstream.send(
                backend.config.target, b"POST", path, headers, raw, wait, attempt
            )
        except TimeoutError as exc:
            raise Retryable(GatewayError(504, f"backend {bid} timed out"), "timeout") from exc
        except UpstreamError as exc:
            raise _retryable(bid, exc) from exc
        try:
            if resp.status >= 500 or resp.status == 429:
                await resp.read(wait)
                resp.release()
                raise Retryable(
                    GatewayError(502, f"backend {bid} answered {resp.status}"),
                    f"status_{resp.status}",
                )
            echoed = _sent_id(headers) if backend.config.echoes_request_id else None
            if echoed is not None and not _header_named(resp.raw_headers, echoed):
                raise _mismatch(bid)
            if not stream or resp.status != 200:
                body = await resp.read(wait)
                answer = _parse(body) if 200 <= resp.status < 300 else None
                # Checked before the connection goes back to the pool: an answer that
                # is not this request's says the connection is out of step, and the
                # real one may still be on its way (the `except` below closes it).
                if answer is _NOT_JSON:
                    raise Retryable(
                        GatewayError(
                            502,
                            f"backend {bid} answered {resp.status} with a body that is not JSON",
                            code="upstream_error",
                        ),
                        "garbage",
                    )
                if echoed is not None and resp.status == 200 and not _answer_named(answer, echoed):
                    raise _mismatch(bid)
                resp.release()
                return Upstream(backend, resp, body, False, path, answer=answer)
            events = SSEScanner(self.settings.limits.response_body_bytes)
            first, ok = await _first_event(resp, events, wait)
            if not ok:
                raise Retryable(
                    GatewayError(
                        502,
                        f"backend {bid} answered a stream that is not server-sent events",
                        code="upstream_error",
                    ),
                    "garbage",
                )
            if echoed is not None and not _named(first, echoed):
                raise _mismatch(bid)
            backend.progress_at = time.monotonic()
            return Upstream(backend, resp, first, True, path, events=events)
        except TimeoutError as exc:
            resp.close()
            raise Retryable(
                GatewayError(504, f"backend {bid} sent no response in time"),
                "first_byte_timeout",
            ) from exc
        except UpstreamError as exc:
            resp.close()
            raise _retryable(bid, exc) from exc
        except BaseException:
            resp.close()
            raise


def _retryable(backend_id: str, exc: UpstreamError) -> Retryable:
    # A stall is a backend that did not answer in time, as a timeout is.
    status = 504 if exc.reason == "stalled" else 502
    message = f"backend {backend_id} {REASONS.get(exc.reason, exc.reason)}"
    return Retryable(GatewayError(status, message, code="upstream_error"), exc.reason)


_ANSWER_ID = re.compile(rb'"id"\s*:\s*"([^"]*)"')


def _sent_id(headers: list[tuple[bytes, bytes]]) -> bytes:
    return next((v for k, v in headers if k == b"x-request-id"), b"")


def _header_named(headers: list[tuple[bytes, bytes]], request_id: bytes) -> bool:
    """Does the answer's own X-Request-Id, if it sent one, say `request_id`?"""
    for k, v in headers:
        if k.lower() == b"x-request-id":
            return v == request_id
    return True


def _named(first: bytes, request_id: bytes) -> bool:
    """Is a stream's first event named after `request_id`? A backend that promised
    to name its answers and sent an event without an `id` broke the promise."""
    found = _ANSWER_ID.search(first)
    return found is not None and found.group(1).endswith(request_id)


def _answer_named(answer: Any, request_id: bytes) -> bool:
    """Is a whole answer's `id` named after `request_id`?"""
    rid = answer.get("id") if isinstance(answer, dict) else None
    return isinstance(rid, str) and rid.encode().endswith(request_id)


async def _first_event(
    resp: UpstreamResponse, events: SSEScanner, wait: float
) -> tuple[bytes, bool]:
    """A stream's bytes up to its first whole data event (or its end), and whether
    they are server-sent events. Until then nothing is relayed, so that the answer's
    name can be checked and a failure can still go to another backend; `wait` bounds
    each wait for more bytes (the monitor aborts a backend that trickles)."""
    chunks: list[bytes] = []
    while True:
        chunk = await resp.readany(wait)
        if not chunk:
            return b"".join(chunks), events.finish()
        chunks.append(chunk)
        if not events.feed(chunk):
            return b"".join(chunks), False
        if resp.ended():
            return b"".join(chunks), events.finish()
        if events.data_events:
            return b"".join(chunks), True


def _ranking(
    policy: Policy, info: RequestInfo, view: ClusterView, first: Decision
) -> Iterator[Decision]:
    """`first` (the policy's decision), then the rest of its ranking of the same
    snapshot, worked out only if the first attempt fails. The backends' cached prefix
    blocks are a live view, which the first dispatch has changed, so `first` is left
    out by name rather than by position."""
    yield first
    for decision in policy.ranked(info, view):
        if decision.backend_id != first.backend_id:
            yield decision


def _mismatch(backend_id: str) -> Retryable:
    # Another request's answer: the connection is closed, the request goes elsewhere.
    return Retryable(
        GatewayError(502, f"backend {backend_id} answered another request", code="upstream_error"),
        "crossed",
    )


_NOT_JSON = object()


def _parse(body: bytes) -> Any:
    """The body as JSON, or `_NOT_JSON`."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return _NOT_JSON
