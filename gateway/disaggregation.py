"""Prefill/decode disaggregation: vLLM's protocol, as one way of serving a request.

The request is sent to a prefill instance (chosen by the `prefill` policy) with
`max_tokens=1` and `kv_transfer_params` asking for remote decode. The prefill's answer
carries the `kv_transfer_params` the decode side needs to pull the KV cache; the
request then goes to the decode instance the `decode` policy chooses (NetKV prices
the transfer from this prefill), with those parameters, and its answer is the
client's. While the KV cache is in flight it counts towards NetKV's self-contention
(a `KVTransferCounting` hook on the decode attempt).
"""

from __future__ import annotations

import time
from dataclasses import replace

import orjson
from starlette.responses import Response

from gateway.answers import Answers
from gateway.backends import BackendPool
from gateway.errors import GatewayError
from gateway.forwarding import Forwarder
from gateway.hooks import KVTransferCounting, Outcome
from gateway.incoming import Incoming, RequestInfos
from gateway.metrics import GatewayMetrics, series
from gateway.relay import RelayResponse
from gateway.routes import Routes
from gateway.transfers import KVTransfers

# Fields the prefill must not see: it answers one token, whole.
_PREFILL_DROP = frozenset(("stream_options", "max_completion_tokens", "n"))
_REMOTE_DECODE = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


class Disaggregated:
    """Serves a model that has both prefill and decode instances."""

    def __init__(
        self,
        routes: Routes,
        pool: BackendPool,
        infos: RequestInfos,
        forwarder: Forwarder,
        answers: Answers,
        transfers: KVTransfers,
        metrics: GatewayMetrics,
    ) -> None:
        self.routes = routes
        self.pool = pool
        self.infos = infos
        self.forwarder = forwarder
        self.answers = answers
        self.transfers = transfers
        self.metrics = metrics

    async def serve(self, req: Incoming) -> Response | RelayResponse:
        body, model, rid, t0 = req.body, req.model, req.rid, req.t0
        info = self.infos.build(req, self.routes.pd_hashes, self.routes.pd_counted)
        prefill_body = {k: v for k, v in body.items() if k not in _PREFILL_DROP}
        prefill_body.update(max_tokens=1, stream=False, kv_transfer_params=_REMOTE_DECODE)
        up, t_prefill_sent = await self.forwarder.forward(
            self.routes.prefill,
            info,
            req.path,
            orjson.dumps(prefill_body),
            req.headers,
            model,
            rid,
            stream=False,
        )
        prefill_wait = time.perf_counter() - t_prefill_sent
        prefill = up.backend
        self.pool.finished(prefill, up.entry)
        if up.response.status != 200:
            return self.answers.respond(
                up, model, rid, t0, t_prefill_sent, time.perf_counter(), False
            )
        self.pool.succeeded(prefill)
        self.answers.ended(up, Outcome("200", 0, time.perf_counter() - t0))
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
        up, t_sent = await self.forwarder.forward(
            self.routes.decode,
            replace(info, prefill_id=prefill.id),
            req.path,
            orjson.dumps(decode_body),
            req.headers,
            model,
            rid,
            hooks=(transfer,),
        )
        t_first = time.perf_counter()  # the decode side's first bytes: the cache has landed
        tier = transfer.tiers[up.backend.id]  # as the transfer was priced
        series(self.metrics.pd_requests, prefill.id, up.backend.id, tier).inc()
        series(self.metrics.pd_ttft, tier).observe(t_first - t0)
        series(self.metrics.pd_decode_wait, tier).observe(t_first - t_sent)
        return self.answers.respond(up, model, rid, t0, t_sent, t_first, info.stream, prefill_wait)
