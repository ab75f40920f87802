"""The NetKV oracle's operator API, under `/admin/oracle` (admin token required).

Operators push the static topology (tier_map, tier_bandwidth, tier_latency,
instance locality) and the dynamic congestion map, or raw per-link utilisation
that is aggregated to per-tier rho. Every update is validated in full; a
rejected one leaves the previous state in place. State lives in the shared
store, so every replica routes on the same oracle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Body, Query
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.responses import Response

from gateway.backends import BackendPool
from gateway.errors import GatewayError
from gateway.store import CONFIG_ORACLE, ORACLE_FIELD, SharedStore, StoreUnavailable
from gateway.transfers import KVTransfers
from oracle.state import LinkSample, OracleState

STATIC_FIELDS = ("instances", "tier_map", "tier_bandwidth", "tier_latency")


class LinkReport(BaseModel):
    model_config = ConfigDict(extra="forbid")
    links: list[LinkSample]


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def _invalid(exc: ValidationError) -> GatewayError:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    msg = str(first.get("msg", "invalid"))
    return GatewayError(400, f"{where}: {msg}" if where else msg, param=where or None)


def oracle_router(
    store: SharedStore,
    pool: BackendPool,
    transfers: KVTransfers,
    read: Callable[[], OracleState | None],
    apply: Callable[[OracleState], None],
) -> APIRouter:
    """`read` gives the replica's oracle state, `apply` adopts a new one."""
    r = APIRouter(prefix="/admin/oracle", tags=["oracle"])  # GatewayApp checks the token

    def current() -> OracleState:
        return read() or OracleState()

    async def save(state: OracleState) -> Response:
        try:
            await store.put(CONFIG_ORACLE, ORACLE_FIELD, state.model_dump_json())
        except StoreUnavailable as exc:
            raise GatewayError(
                503, "the shared store is unreachable; the update was not applied", retry_after=1.0
            ) from exc
        apply(state)
        return _json(state.describe())

    def check_instances(static: dict[str, Any]) -> None:
        declared = set(static.get("instances") or current().topology.instances)
        known = declared or {b.id for b in pool}
        for pair in static.get("tier_map") or []:
            if isinstance(pair, dict):
                for name in (pair.get("a"), pair.get("b")):
                    if name not in known:
                        raise GatewayError(
                            400, f"tier_map names unknown instance {name!r}", param="tier_map"
                        )

    @r.get("")
    async def get_oracle() -> Response:
        return _json(current().describe())

    @r.put("/topology")
    async def put_topology(static: Annotated[dict[str, Any], Body()]) -> Response:
        unknown = set(static) - set(STATIC_FIELDS)
        if unknown:
            raise GatewayError(
                400,
                f"unknown topology fields: {sorted(unknown)}; the static "
                f"fields are {list(STATIC_FIELDS)}",
            )
        check_instances(static)
        try:
            state = current().with_topology(static)
        except ValidationError as exc:
            raise _invalid(exc) from exc
        return await save(state)

    @r.put("/congestion")
    async def put_congestion(rho: Annotated[dict[str, Any], Body()]) -> Response:
        try:
            state = current().with_congestion(rho)
        except ValidationError as exc:
            raise _invalid(exc) from exc
        return await save(state)

    @r.post("/links")
    async def post_links(report: LinkReport) -> Response:
        try:
            state = current().with_links(report.links)
        except ValidationError as exc:
            raise _invalid(exc) from exc
        return await save(state)

    @r.get("/cost")
    async def transfer_cost(
        prefill: Annotated[str, Query(description="prefill instance")],
        decode: Annotated[str, Query(description="decode instance")],
        tokens: Annotated[int, Query(ge=0, description="tokens whose KV must travel")] = 0,
        nbytes: Annotated[float | None, Query(alias="bytes", ge=0, description="or bytes")] = None,
    ) -> Response:
        topo = current().topology
        for name in (prefill, decode):
            if topo.instances and name not in topo.instances:
                raise GatewayError(404, f"unknown instance {name!r}", param="instance")
        backend = pool.get(decode)
        per_token = backend.config.profile.kv_bytes_per_token if backend else 327_680.0
        payload = nbytes if nbytes is not None else tokens * per_token
        tier = topo.tier(prefill, decode)
        c_self = transfers.counts.get((prefill, tier), 0)
        return _json(
            {
                "prefill": prefill,
                "decode": decode,
                "tier": tier,
                "bytes": payload,
                "bandwidth_gbps": topo.tier_bandwidth[tier],
                "latency_us": topo.tier_latency.get(tier, 0.0),
                "rho": topo.congestion.get(tier, 0.0),
                "self_contention": c_self,
                "effective_gbps": topo.effective_bandwidth(tier, c_self) * 8 / 1e9,
                "transfer_s": topo.transfer_seconds(prefill, decode, payload, c_self),
                "age_s": current().age_s(),
            }
        )

    @r.get("/intents")
    async def intents(count: Annotated[int, Query(ge=1, le=10_000)] = 100) -> Response:
        try:
            records = await store.read_intents(count)
        except StoreUnavailable as exc:
            raise GatewayError(503, "the shared store is unreachable", retry_after=1.0) from exc
        return _json({"intents": records})

    return r
