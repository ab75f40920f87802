"""The request path: validate, build `RequestInfo`, decide, forward, relay.

The client's bytes are forwarded as sent (vLLM extras and all); the body is
parsed only to validate it and to read what routing needs. Retries go to
another backend only while nothing has reached the client: a streamed response
is committed when its first chunk arrives, and a later failure ends the stream
with an OpenAI-style error event.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import random
import re
import time
from collections.abc import AsyncGenerator, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from gateway.auth import require_client_key
from gateway.backends import Backend, BackendPool, InflightEntry
from gateway.errors import GatewayError
from gateway.hooks import Dispatch, Hook, KVTransferCounting, Outcome
from gateway.logs import request_id
from gateway.metrics import GatewayMetrics, series
from gateway.relay import ClientWatch, RelayResponse
from gateway.request_schema import validate
from gateway.routes import Routes
from gateway.settings import Settings
from gateway.sse import SSEScanner
from gateway.transfers import KVTransfers
from gateway.upstream import Attempt, UpstreamError, UpstreamPool, UpstreamResponse
from policies.pipeline import Policy
from policies.plugins import Need
from policies.text import block_hashes, estimate_tokens, prompt_text, stable_hash
from policies.types import ClusterView, Decision, RequestInfo

log = logging.getLogger("edgeroute.proxy")

# Never forwarded in either direction: hop-by-hop, framing, or handled here.
_DROP_UP = frozenset(
    [
        b"host",
        b"content-length",
        b"connection",
        b"keep-alive",
        b"transfer-encoding",
        b"te",
        b"trailer",
        b"upgrade",
        b"proxy-authorization",
        b"proxy-connection",
        b"authorization",
        b"cookie",
        b"accept-encoding",
        # The gateway holds the whole body already; forwarded, it would make the
        # backend answer 100 Continue first.
        b"expect",
    ]
)
_DROP_DOWN = frozenset(
    b"content-length connection keep-alive transfer-encoding te trailer upgrade "
    b"proxy-connection date server".split()
)
# An x-request-id the gateway echoes and forwards as given; others are replaced.
_REQUEST_ID = re.compile(rb"[!-~]{1,200}")
_REASONS = {
    "connect": "is unreachable",
    "broken": "broke the exchange",
    "headers_too_large": "sent response headers over the gateway's limits",
    "body_too_large": "sent a response body over the gateway's limit",
    "stalled": "stalled (no progress while peers answered)",
}
_PREFILL_DROP = frozenset(("stream_options", "max_completion_tokens", "n"))
_REMOTE_DECODE = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


@dataclass
class Upstream:
    """A backend's answer, received up to the point where it can still be retried."""

    backend: Backend
    response: UpstreamResponse
    first: bytes  # the first body chunk (stream) or the whole body
    streaming: bool  # more chunks may follow `first`
    entry: InflightEntry | None = None
    events: SSEScanner | None = None  # a stream's framing check and token count
    answer: Any = None  # a whole 2xx answer, parsed once (it must be JSON)
    dispatch: Dispatch | None = None  # the attempt that got this answer, for the hooks
    hooks: tuple[Hook, ...] = ()


def _text(hdrs: dict[bytes, bytes], name: bytes) -> str | None:
    value = hdrs.get(name)
    return value.decode("latin-1") if value is not None else None


class Retryable(Exception):
    def __init__(self, error: GatewayError, reason: str) -> None:
        super().__init__(error.message)
        self.error = error
        self.reason = reason


class Proxy:
    """The OpenAI endpoints' request path: validation, routing, forwarding with
    retries, disaggregated serving, and each request's accounting."""

    def __init__(
        self,
        settings: Settings,
        pool: BackendPool,
        routes: Routes,
        upstream: UpstreamPool,
        metrics: GatewayMetrics,
        transfers: KVTransfers,
        hooks: Sequence[Hook] = (),
    ) -> None:
        """`hooks`: called around every attempt of every request (see gateway.hooks)."""
        self.settings = settings
        self.pool = pool
        self.routes = routes
        self.upstream = upstream
        self.metrics = metrics
        self.transfers = transfers
        self.hooks = tuple(hooks)
        s = settings
        self._seq = itertools.count()
        self._rid_prefix = os.urandom(6).hex()  # request ids: this prefix and a counter
        self._rids = itertools.count()
        # `first_byte` bounds a stream's wait for its first event, `response` the wait
        # for a whole answer, `idle` the gaps in a stream.
        self._first_byte = s.timeouts.first_byte
        self._response = s.timeouts.response
        self._idle = s.timeouts.idle

    async def handle(
        self, request: Request, chat: bool, watch: ClientWatch
    ) -> Response | RelayResponse:
        """Answer one OpenAI request. `watch` is started once the body is in; the
        caller finishes it when the response has been sent."""
        t0 = time.perf_counter()
        # ASGI servers give lower-case names; one dict beats Starlette's Headers here.
        hdrs: dict[bytes, bytes] = dict(request.scope["headers"])
        given = hdrs.get(b"x-request-id")
        if given is not None and _REQUEST_ID.fullmatch(given):
            rid = given.decode("ascii")
        else:
            rid = f"{self._rid_prefix}{next(self._rids):x}"
            hdrs.pop(b"x-request-id", None)
        request_id.set(rid)
        model_label = "unknown"
        try:
            require_client_key(_text(hdrs, b"authorization"), self.settings.api_keys)
            raw = await self._read_body(request, hdrs)
            watch.start(request.scope, request.receive)
            try:
                parsed = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise GatewayError(400, f"the body is not valid JSON: {exc}") from exc
            body = validate(parsed, chat)
            model = body["model"]
            if model not in self.pool.known_models:
                raise GatewayError(
                    404,
                    f"The model `{model}` does not exist.",
                    param="model",
                    code="model_not_found",
                )
            model_label = model
            path = "/v1/chat/completions" if chat else "/v1/completions"
            return await self._route(request, hdrs, path, raw, body, rid, t0)
        except ClientDisconnect:
            # The client left while sending its body: nothing to answer, nothing wrong.
            series(self.metrics.requests, model_label, "none", "499").inc()
            self.metrics.client_aborts.labels("upload").inc()
            log.info("client disconnected during its upload")
            return _Raw(499, [], b"")
        except GatewayError as exc:
            series(self.metrics.requests, model_label, "none", str(exc.status)).inc()
            if exc.status in (502, 504):
                log.warning("request failed", extra={"status": exc.status, "error": exc.message})
            return exc.response({"x-request-id": rid})

    async def _read_body(self, request: Request, hdrs: dict[bytes, bytes]) -> bytes:
        limit = self.settings.max_body_bytes
        declared = hdrs.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise GatewayError(413, f"the request body is larger than {limit} bytes")
        chunks = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise GatewayError(413, f"the request body is larger than {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    def _request_info(
        self, hdrs: dict[bytes, bytes], body: dict[str, Any], uses_prefix: bool
    ) -> RequestInfo:
        text = prompt_text(body)
        session = _text(hdrs, b"x-session-id") or body.get("user")
        return RequestInfo(
            model=body["model"],
            prompt_tokens=estimate_tokens(text),
            block_hashes=(
                block_hashes(text, self.settings.prefix_block_tokens) if uses_prefix else ()
            ),
            max_tokens=body.get("max_completion_tokens") or body.get("max_tokens"),
            session_hash=stable_hash(session) if isinstance(session, str) and session else None,
            seq=next(self._seq),
            entropy=random.getrandbits(63),
            now=time.monotonic(),
            stream=bool(body.get("stream")),
            task=_text(hdrs, b"x-edgeroute-task"),
            prompt=text,
        )

    async def _route(
        self,
        request: Request,
        hdrs: dict[bytes, bytes],
        path: str,
        raw: bytes,
        body: dict[str, Any],
        rid: str,
        t0: float,
    ) -> Response | RelayResponse:
        s = self.settings
        model = body["model"]
        if s.max_inflight and self.pool.total_inflight() >= s.max_inflight:
            series(self.metrics.shed, model, "max_inflight").inc()
            raise GatewayError(
                429,
                "the gateway is at its in-flight limit; retry later",
                code="overloaded",
                retry_after=s.retry_after,
            )
        headers = self._upstream_headers(request.scope["headers"], hdrs, rid)
        if model in self.pool.pd_models:
            return await self._route_disaggregated(hdrs, path, body, headers, rid, t0)
        pipeline = self.routes.for_model(model)
        info = self._request_info(hdrs, body, Need.BLOCK_HASHES in pipeline.needs)
        up, t_sent = await self._forward(pipeline, info, path, raw, headers, model, rid)
        return self._respond(up, model, rid, t0, t_sent, time.perf_counter(), info.stream)

    async def _forward(
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
        own, called after the proxy's.
        """
        hooks = self.hooks + hooks
        s = self.settings
        stream = info.stream if stream is None else stream
        view = self.pool.view
        t_decide = time.perf_counter()
        first = pipeline.decide(info, view)
        # Taken before the series lookup below, which is not the policy's time.
        decided_in = time.perf_counter() - t_decide
        series(self.metrics.decision, pipeline.name).observe(decided_in)
        if first.backend_id is None:
            qos = first.token_target is not None
            series(self.metrics.shed, model, "qos" if qos else "no_backend").inc()
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
                series(self.metrics.requests, model, backend.id, "499").inc()
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

    async def _route_disaggregated(
        self,
        hdrs: dict[bytes, bytes],
        path: str,
        body: dict[str, Any],
        headers: list[tuple[bytes, bytes]],
        rid: str,
        t0: float,
    ) -> Response | RelayResponse:
        """vLLM's disaggregated protocol: prefill with max_tokens=1 and kv_transfer_params
        asking for remote decode, then decode where the decode policy says, carrying the
        kv_transfer_params the prefill returned."""
        model = body["model"]
        hashed = self.routes.pd_hashes
        info = self._request_info(hdrs, body, hashed)
        prefill_body = {k: v for k, v in body.items() if k not in _PREFILL_DROP}
        prefill_body.update(max_tokens=1, stream=False, kv_transfer_params=_REMOTE_DECODE)
        up, t_prefill_sent = await self._forward(
            self.routes.prefill,
            info,
            path,
            orjson.dumps(prefill_body),
            headers,
            model,
            rid,
            stream=False,
        )
        prefill_wait = time.perf_counter() - t_prefill_sent
        prefill = up.backend
        self.pool.finished(prefill, up.entry)
        if up.response.status != 200:
            return self._respond(up, model, rid, t0, t_prefill_sent, time.perf_counter(), False)
        self.pool.succeeded(prefill)
        self._ended(up, Outcome("200", 0, time.perf_counter() - t0))
        try:
            params = up.answer["kv_transfer_params"]
            if not isinstance(params, dict):
                raise TypeError
        except (KeyError, TypeError) as exc:
            raise GatewayError(
                502,
                f"prefill backend {prefill.id} returned no kv_transfer_params",
                code="upstream_error",
            ) from exc

        transfer = KVTransferCounting(self.transfers, self.metrics, self.pool.oracle, prefill)
        decode_body = dict(body)
        decode_body["kv_transfer_params"] = params
        up, t_sent = await self._forward(
            self.routes.decode,
            replace(info, prefill_id=prefill.id),
            path,
            orjson.dumps(decode_body),
            headers,
            model,
            rid,
            hooks=(transfer,),
        )
        t_first = time.perf_counter()  # the decode side's first bytes: the cache has landed
        tier = transfer.tiers[up.backend.id]  # as the transfer was priced
        series(self.metrics.pd_requests, prefill.id, up.backend.id, tier).inc()
        series(self.metrics.pd_ttft, tier).observe(t_first - t0)
        series(self.metrics.pd_decode_wait, tier).observe(t_first - t_sent)
        return self._respond(up, model, rid, t0, t_sent, t_first, info.stream, prefill_wait)

    def _upstream_headers(
        self, raw: list[tuple[bytes, bytes]], hdrs: dict[bytes, bytes], rid: str
    ) -> list[tuple[bytes, bytes]]:
        out = [(k, v) for k, v in raw if k not in _DROP_UP]
        if b"x-request-id" not in hdrs:
            out = [(k, v) for k, v in out if k != b"x-request-id"]
            out.append((b"x-request-id", rid.encode("ascii")))
        s = self.settings
        if s.forward_client_credentials:
            if not s.api_keys and b"authorization" in hdrs:
                out.append((b"authorization", hdrs[b"authorization"]))
            out += [(k, v) for k, v in raw if k == b"cookie"]
        return out

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
            if not stream or resp.status != 200:
                body = await resp.read(wait)
                answer = _parse(body) if 200 <= resp.status < 300 else None
                if echoed is not None and resp.status == 200 and not _answer_named(answer, echoed):
                    raise _mismatch(bid)
                resp.release()
                if answer is _NOT_JSON:
                    raise Retryable(
                        GatewayError(
                            502,
                            f"backend {bid} answered {resp.status} with a body that is not JSON",
                            code="upstream_error",
                        ),
                        "garbage",
                    )
                return Upstream(backend, resp, body, False, answer=answer)
            events = SSEScanner(self.settings.limits.response_body_bytes)
            first = await resp.readany(wait)
            ok = events.feed(first)
            if ok and resp.ended():
                ok = events.finish()
            if echoed is not None and not _named(first, echoed):
                raise _mismatch(bid)
            if not ok:
                raise Retryable(
                    GatewayError(
                        502,
                        f"backend {bid} answered a stream that is not server-sent events",
                        code="upstream_error",
                    ),
                    "garbage",
                )
            backend.progress_at = time.monotonic()
            return Upstream(backend, resp, first, True, events=events)
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

    def _respond(
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
            self._finished(up, model, str(status), t0, tokens)
            return _Raw(status, headers, up.first)
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
                reason = _REASONS.get(exc.reason, "failed")
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
            self._finished(up, model, status, t0, events.tokens)

    def _finished(self, up: Upstream, model: str, status: str, t0: float, tokens: int) -> None:
        """Account for a request that has ended, well or not, on `up.backend`."""
        b = up.backend
        elapsed = time.perf_counter() - t0
        self.pool.finished(b, up.entry)
        series(self.metrics.requests, model, b.id, status).inc()
        series(self.metrics.e2e, model, b.id).observe(elapsed)
        if tokens:
            series(self.metrics.output_tokens, model, b.id).inc(tokens)
        self._ended(up, Outcome(status, tokens, elapsed))

    @staticmethod
    def _ended(up: Upstream, outcome: Outcome) -> None:
        if up.dispatch is not None:
            for hook in up.hooks:
                hook.ended(up.dispatch, outcome)


def _retryable(backend_id: str, exc: UpstreamError) -> Retryable:
    # A stall is a backend that did not answer in time, as a timeout is.
    status = 504 if exc.reason == "stalled" else 502
    message = f"backend {backend_id} {_REASONS.get(exc.reason, exc.reason)}"
    return Retryable(GatewayError(status, message, code="upstream_error"), exc.reason)


_ANSWER_ID = re.compile(rb'"id"\s*:\s*"([^"]*)"')


def _sent_id(headers: list[tuple[bytes, bytes]]) -> bytes:
    return next((v for k, v in headers if k == b"x-request-id"), b"")


def _named(chunk: bytes, request_id: bytes) -> bool:
    """Does a stream's first `id` end with `request_id`? (True when it has none yet.)"""
    found = _ANSWER_ID.search(chunk)
    return found is None or found.group(1).endswith(request_id)


def _answer_named(answer: Any, request_id: bytes) -> bool:
    """Does a whole answer's `id` end with `request_id`? (True when it has none.)"""
    rid = answer.get("id") if isinstance(answer, dict) else None
    return not isinstance(rid, str) or rid.encode().endswith(request_id)


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


class _NotSSE(Exception):
    """A stream's bytes broke the server-sent-events framing."""


_NOT_JSON = object()


def _parse(body: bytes) -> Any:
    """The body as JSON, or `_NOT_JSON`."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return _NOT_JSON


def _completion_tokens(answer: Any) -> int:
    """The answer's `usage.completion_tokens`, or 0."""
    usage = answer.get("usage") if isinstance(answer, dict) else None
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else 0


class _Raw(Response):
    """A response whose headers are already raw pairs."""

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.status_code = status
        self.body = body
        self.raw_headers = headers
        self.background = None
