"""The OpenAI endpoints' request path: check the request, then serve it.

`Proxy.handle` reads and validates the body, sheds load past the in-flight limit,
and hands the request to the way its model is served: `Direct` (one policy picks
one backend) or `Disaggregated` (prefill then decode, in gateway.disaggregation).
Forwarding with retries is gateway.forwarding; the response and its accounting are
gateway.answers. The client's bytes are forwarded as sent (vLLM extras and all); the
body is parsed only to validate it and to read what routing needs.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import time
from typing import Any, Protocol

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from gateway.answers import Answers, Raw
from gateway.arrivals import ArrivalCounts
from gateway.auth import require_client_key
from gateway.backends import BackendPool
from gateway.disaggregation import Disaggregated
from gateway.errors import GatewayError
from gateway.forwarding import Forwarder
from gateway.hooks import Hook
from gateway.incoming import Incoming, RequestInfos, header_text
from gateway.logs import request_id
from gateway.metrics import GatewayMetrics, series
from gateway.relay import ClientWatch, RelayResponse
from gateway.request_schema import Endpoint, validate
from gateway.routes import Routes
from gateway.settings import Settings
from gateway.transfers import KVTransfers
from gateway.upstream import UpstreamPool
from policies.plugins import Need

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
# An x-request-id the gateway echoes and forwards as given; others are replaced.
_REQUEST_ID = re.compile(rb"[!-~]{1,200}")


class Handler(Protocol):
    """One way of serving an accepted request (llm-d calls this a profile handler)."""

    async def serve(self, req: Incoming) -> Response | RelayResponse: ...


class Direct:
    """The model's policy picks a backend; its answer is the client's."""

    def __init__(
        self, routes: Routes, infos: RequestInfos, forwarder: Forwarder, answers: Answers
    ) -> None:
        self.routes = routes
        self.infos = infos
        self.forwarder = forwarder
        self.answers = answers

    async def serve(self, req: Incoming) -> Response | RelayResponse:
        policy = self.routes.for_model(req.model)
        needs = policy.needs
        info = self.infos.build(req, Need.BLOCK_HASHES in needs, Need.ARRIVAL_RATE in needs)
        up, t_sent = await self.forwarder.forward(
            policy, info, req.path, req.raw, req.headers, req.model, req.rid
        )
        return self.answers.respond(
            up, req.model, req.rid, req.t0, t_sent, time.perf_counter(), info.stream
        )


class Proxy:
    """Checks each OpenAI request and hands it to the handler for its model."""

    def __init__(
        self,
        settings: Settings,
        pool: BackendPool,
        routes: Routes,
        upstream: UpstreamPool,
        metrics: GatewayMetrics,
        transfers: KVTransfers,
        arrivals: ArrivalCounts,
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.metrics = metrics
        self._rid_prefix = os.urandom(6).hex()  # request ids: this prefix and a counter
        self._rids = itertools.count()
        infos = RequestInfos(settings.prefix_block_tokens, arrivals)
        self.forwarder = Forwarder(settings, pool, upstream, metrics)
        answers = Answers(pool, metrics, settings.timeouts.idle)
        self.direct = Direct(routes, infos, self.forwarder, answers)
        self.disaggregated = Disaggregated(
            routes, pool, infos, self.forwarder, answers, transfers, metrics
        )

    @property
    def hooks(self) -> tuple[Hook, ...]:
        """Called around every attempt of every request (see gateway.hooks)."""
        return self.forwarder.hooks

    @hooks.setter
    def hooks(self, hooks: tuple[Hook, ...]) -> None:
        self.forwarder.hooks = hooks

    async def handle(
        self, request: Request, endpoint: Endpoint, watch: ClientWatch
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
            require_client_key(header_text(hdrs, b"authorization"), self.settings.api_keys)
            raw = await self._read_body(request, hdrs)
            watch.start(request.scope, request.receive)
            try:
                parsed = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise GatewayError(400, f"the body is not valid JSON: {exc}") from exc
            body = validate(parsed, endpoint)
            model = body["model"]
            if model not in self.pool.known_models:
                raise GatewayError(
                    404,
                    f"The model `{model}` does not exist.",
                    param="model",
                    code="model_not_found",
                )
            model_label = model
            return await self._route(request, hdrs, endpoint, raw, body, rid, t0)
        except ClientDisconnect:
            # The client left while sending its body: nothing to answer, nothing wrong.
            series(self.metrics.requests, model_label, endpoint.path, "none", "499").inc()
            self.metrics.client_aborts.labels("upload").inc()
            log.info("client disconnected during its upload")
            return Raw(499, [], b"")
        except GatewayError as exc:
            series(self.metrics.requests, model_label, endpoint.path, "none", str(exc.status)).inc()
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

    async def _route(
        self,
        request: Request,
        hdrs: dict[bytes, bytes],
        endpoint: Endpoint,
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
        req = Incoming(hdrs, endpoint.path, raw, body, headers, model, rid, t0)
        # Nothing generated, nothing to decode: an embedding goes to one backend whole.
        split = endpoint.generates and model in self.pool.pd_models
        handler: Handler = self.disaggregated if split else self.direct
        return await handler.serve(req)

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
