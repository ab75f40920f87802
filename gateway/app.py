"""The gateway application: state, lifecycle and the HTTP surface.

`create_app(settings)` returns a FastAPI app. The OpenAI routes go through the
lean `Proxy`; everything under `/admin/` requires the admin bearer token.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.responses import PlainTextResponse, Response

from gateway.arrivals import ArrivalCounts
from gateway.auth import require_admin, require_client_key
from gateway.backends import Backend, BackendPool
from gateway.errors import GatewayError
from gateway.hooks import Hook, QoSAccounting, make_hook
from gateway.metrics import GatewayMetrics
from gateway.monitor import Monitor
from gateway.oracle_api import oracle_router
from gateway.prism_scheduler import PlacementRefused, PrismScheduler
from gateway.proxy import Proxy
from gateway.relay import ClientWatch, Receive, Scope, Send
from gateway.request_schema import CHAT, COMPLETIONS, EMBEDDINGS, ENDPOINTS, Endpoint
from gateway.routes import Plan, Routes
from gateway.settings import BackendConfig, RoutingConfig, Settings
from gateway.store import (
    CONFIG_BACKENDS,
    CONFIG_ROUTING,
    SharedStore,
    StoreUnavailable,
)
from gateway.transfers import KVTransfers
from gateway.upstream import UPSTREAM_KEEPALIVE, ResponseLimits, UpstreamPool
from gateway.warmth import keep_warm
from oracle.state import OracleState
from policies import Need, PipelineSpec, Policy, build_policy

log = logging.getLogger("edgeroute.gateway")


def backend_json(cfg: BackendConfig) -> str:
    """A backend's config as the shared store keeps it, secrets included."""
    data = cfg.model_dump(mode="json", exclude_none=True)
    if cfg.api_key is not None:
        data["api_key"] = cfg.api_key.get_secret_value()
    if cfg.moe is not None and cfg.moe.admin_token is not None:
        data["moe"]["admin_token"] = cfg.moe.admin_token.get_secret_value()
    return orjson.dumps(data).decode()


class Gateway:
    """Everything one gateway replica holds."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.replica_id = settings.replica_id or (
            f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        )
        self.metrics = GatewayMetrics()
        self.pool = BackendPool(
            settings.circuit,
            settings.stale_after,
            settings.prefix_cache_entries,
            settings.prefix_block_tokens,
        )
        self.oracle = (
            OracleState(topology=settings.oracle, updated_at=time.time())
            if settings.oracle
            else None
        )
        self.transfers = KVTransfers(self.pool)
        self.routing = settings.routing
        self.routes = Routes(settings.routing)
        self._reloading = asyncio.Lock()
        self._hooks: list[Hook] = []
        url = settings.redis_url.get_secret_value() if settings.redis_url is not None else None
        self.store = SharedStore(url, self.replica_id, settings.replica_ttl)
        self._client: httpx.AsyncClient | None = None  # made in start(), in the loop
        # The proxy path's own client; httpx serves the control plane (scrapes,
        # probes, Prism's pushes).
        lim = settings.limits
        self.upstream = UpstreamPool(
            settings.timeouts.connect,
            limits=ResponseLimits(
                lim.response_headers, lim.response_header_bytes, lim.response_body_bytes
            ),
        )
        self.arrivals = ArrivalCounts()
        self.monitor = Monitor(
            settings,
            self.pool,
            self.store,
            self.metrics,
            self.transfers,
            self,
            lambda: self.client,
            self.arrivals,
        )
        self.prism = PrismScheduler(
            self.pool, self.store, self.metrics, lambda: self.client, settings.prism_replan_seconds
        )
        self.proxy = Proxy(
            settings,
            self.pool,
            self.routes,
            self.upstream,
            self.metrics,
            self.transfers,
            self.arrivals,
        )
        for ref in settings.hooks:
            self._hooks.append(make_hook(ref.type, ref.params))
        self._provide_what_policies_need()
        self._warmth: asyncio.Task[None] | None = None
        self.started = False

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        self._client = httpx.AsyncClient(
            timeout=self.settings.timeouts.scrape,
            limits=httpx.Limits(max_connections=None, keepalive_expiry=UPSTREAM_KEEPALIVE),
            trust_env=False,  # no proxies or netrc from the environment
        )
        self._apply_routing(self.settings.routing)
        self.pool.set_configs(self.settings.backends)
        if self.oracle is not None:
            self.pool.set_network(self.oracle.topology)
        await self.store.start()
        try:
            await self.push_local_config()
            await self.reload_config()
        except StoreUnavailable:
            log.warning("shared store unreachable at start; using the local config for now")
        await self.monitor.scrape_all()
        self.monitor.start()
        self.prism.start()
        if self.settings.keep_warm_ms > 0:
            forwarder = self.proxy.forwarder
            self._warmth = asyncio.create_task(
                keep_warm(
                    self.settings.keep_warm_ms / 1000,
                    self.settings.keep_warm_for_ms / 1000,
                    self.routes,
                    lambda: forwarder.decided_at,
                    forwarder.decided,
                    self.metrics.warmups,
                ),
                name="keep warm",
            )
        self.started = True
        log.info("gateway replica %s ready with %d backends", self.replica_id, len(self.pool))

    async def stop(self) -> None:
        if self._warmth is not None:
            self._warmth.cancel()
            await asyncio.gather(self._warmth, return_exceptions=True)
        await self.prism.stop()
        await self.monitor.stop()
        if self._client is not None:
            await self._client.aclose()
        self.upstream.close()
        await self.store.close()

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            raise RuntimeError("the gateway has not started")
        return self._client

    # -- configuration --------------------------------------------------------------

    def _apply_routing(self, routing: RoutingConfig, plan: Plan | None = None) -> None:
        """Route by `routing`, with its policies as `plan` built them if given."""
        self.routes.use(plan if plan is not None else self.routes.plan(routing))
        self.routing = routing
        self._provide_what_policies_need()

    def _provide_what_policies_need(self) -> None:
        # The snapshot carries what the policies declared they read, and only that.
        self.pool.track_requests = Need.INFLIGHT_REQUESTS in self.routes.needs
        self.pool.provide_network = Need.ORACLE in self.routes.needs
        accounting = Need.LATENCY_TARGETS in self.routes.needs
        qos = (QoSAccounting(self.metrics),) if accounting else ()
        self.proxy.hooks = (*qos, *self._hooks)
        self.pool.rebuild()

    def add_hook(self, hook: Hook) -> None:
        """Call `hook` around every attempt of every request (see gateway.hooks)."""
        self._hooks.append(hook)
        self._provide_what_policies_need()

    def pipeline_for(self, model: str) -> Policy:
        return self.routes.for_model(model)

    async def push_local_config(self) -> None:
        """Seed the store with this replica's config where the store has none."""
        await self.store.seed(
            {c.backend_id: backend_json(c) for c in self.pool.configs()},
            self.routing.to_store(),
            self.oracle.model_dump_json() if self.oracle is not None else None,
        )

    async def reload_config(self) -> None:
        # One reload at a time (the sync loop's and an operator's write): each reads the
        # store when it starts, so the last to finish applies the newest config.
        async with self._reloading:
            await self._reload_config(None)

    async def _reload_config(self, fresh: Plan | None) -> None:
        """Apply the store's config. `fresh`: policies already built for it (by the
        admin API's check), used where their role's spec matches."""
        backends, routing, oracle = await self.store.load_config()
        if oracle is not None:
            try:
                self.set_oracle(OracleState.model_validate(oracle))
            except ValidationError:
                log.error("ignoring invalid oracle state in the shared store")
        configs = []
        for bid, data in backends.items():
            try:
                configs.append(BackendConfig.model_validate(data))
            except ValidationError:
                log.error("ignoring invalid backend %s in the shared store", bid)
        self.pool.set_configs(configs)
        try:
            config = RoutingConfig.from_store(routing)
            # Off the loop: a learned policy loads its models (tens of ms), and requests
            # go on being routed by the policies in use meanwhile.
            plan = await asyncio.to_thread(self.routes.plan, config, fresh)
        except ValidationError:
            log.error("ignoring invalid routing config in the shared store")
        except Exception as exc:  # a plugin's own error: its model files, say
            # Valid, but a policy cannot be built here: the routes stay as they were, and
            # the store's version is taken, so the next sync does not try again.
            log.error("ignoring a routing config whose policies cannot be built: %s", exc)
        else:
            self._apply_routing(config, plan)

    def set_oracle(self, state: OracleState) -> None:
        self.oracle = state
        self.pool.set_network(state.topology)

    async def write_config(
        self, key: str, field: str, payload: str | None, fresh: Plan | None = None
    ) -> None:
        try:
            # Written and applied under the reload lock: a sync that sees the new
            # version meanwhile waits, then finds it applied, with `fresh` in use.
            async with self._reloading:
                await self.store.put(key, field, payload)
                await self._reload_config(fresh)
        except StoreUnavailable as exc:
            raise GatewayError(
                503, "the shared store is unreachable; the change was not applied", retry_after=1.0
            ) from exc


# -- HTTP surface ---------------------------------------------------------------------


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def _backend_state(b: Backend) -> dict[str, Any]:
    now = time.monotonic()
    healthy = b.circuit.available(now)
    return {
        "id": b.id,
        "url": b.config.url,
        "role": b.config.role,
        "models": sorted(b.serves()),
        # Draining is an operator's choice, not a fault: a drained backend stays healthy.
        "healthy": healthy,
        "draining": b.draining,
        "accepting": healthy and not b.draining,
        "circuit": b.circuit.state.name.lower(),
        "inflight": b.inflight,
        "remote_inflight": b.remote_inflight,
        "running": b.stats.running,
        "waiting": b.stats.waiting,
        "kv_usage": b.stats.kv_usage,
        "stats_age_s": None if b.stats.scraped_at < 0 else round(now - b.stats.scraped_at, 3),
        # its answered requests' seconds per token (0: none yet), the QoS policy's view
        "token_latency_s": b.token_latency,
    }


def _admin_router(gw: Gateway) -> APIRouter:
    r = APIRouter(prefix="/admin", tags=["admin"])  # GatewayApp checks the token

    def get_backend(backend_id: str) -> Backend:
        b = gw.pool.get(backend_id)
        if b is None:
            raise GatewayError(404, f"no backend {backend_id!r}", param="backend_id")
        return b

    @r.get("/backends")
    async def list_backends() -> Response:
        return _json({"backends": [_backend_state(b) for b in gw.pool]})

    @r.post("/backends", status_code=201)
    async def add_backend(cfg: BackendConfig) -> Response:
        if gw.pool.get(cfg.backend_id) is not None:
            raise GatewayError(409, f"backend {cfg.backend_id!r} exists", param="id")
        await gw.write_config(CONFIG_BACKENDS, cfg.backend_id, backend_json(cfg))
        b = gw.pool.get(cfg.backend_id)
        assert b is not None
        return _json(_backend_state(b), 201)

    @r.delete("/backends/{backend_id}", status_code=204)
    async def remove_backend(backend_id: str) -> Response:
        get_backend(backend_id)
        await gw.write_config(CONFIG_BACKENDS, backend_id, None)
        return Response(status_code=204)

    async def set_draining(backend_id: str, draining: bool) -> Response:
        b = get_backend(backend_id)
        cfg = b.config.model_copy(update={"draining": draining})
        await gw.write_config(CONFIG_BACKENDS, backend_id, backend_json(cfg))
        return _json(_backend_state(get_backend(backend_id)))

    @r.post("/backends/{backend_id}/drain")
    async def drain(backend_id: str) -> Response:
        return await set_draining(backend_id, True)

    @r.post("/backends/{backend_id}/undrain")
    async def undrain(backend_id: str) -> Response:
        return await set_draining(backend_id, False)

    @r.get("/routing")
    async def get_routing() -> Response:
        return _json(gw.routing.model_dump(mode="json", exclude_none=True))

    async def check(role: str, spec: PipelineSpec) -> Plan:
        """Build it before storing it: a learned policy's model files must load (off
        the loop, which goes on routing meanwhile). What it built is what the routes
        then use, so a change is built once."""
        try:
            return {role: (spec, await asyncio.to_thread(build_policy, spec))}
        except Exception as exc:
            raise GatewayError(
                400, f"policy {spec.policy!r} cannot be built: {exc}", param="policy"
            ) from exc

    @r.put("/routing/{role}")
    async def put_role(role: str, spec: PipelineSpec) -> Response:
        """`default`, or for disaggregated serving `prefill` and `decode`."""
        keys = {v: k for k, v in RoutingConfig.ROLES.items()}
        if role not in keys:
            raise GatewayError(
                404, f"no routing role {role!r}; roles: {sorted(keys)}", param="role"
            )
        fresh = await check(keys[role], spec)
        await gw.write_config(CONFIG_ROUTING, keys[role], spec.model_dump_json(), fresh)
        return _json(gw.routing.model_dump(mode="json", exclude_none=True))

    @r.put("/routing/models/{model}")
    async def put_model(model: str, spec: PipelineSpec) -> Response:
        if model.startswith("*"):
            raise GatewayError(400, "model names cannot start with '*'", param="model")
        fresh = await check(model, spec)
        await gw.write_config(CONFIG_ROUTING, model, spec.model_dump_json(), fresh)
        return _json(gw.routing.model_dump(mode="json", exclude_none=True))

    @r.delete("/routing/models/{model}", status_code=204)
    async def delete_model(model: str) -> Response:
        if model not in gw.routing.models:
            raise GatewayError(404, f"no routing override for {model!r}", param="model")
        await gw.write_config(CONFIG_ROUTING, model, None)
        return Response(status_code=204)

    @r.get("/prism")
    async def prism_state() -> Response:
        return _json(gw.prism.describe())

    @r.post("/prism/plan")
    async def prism_plan() -> Response:
        """Plan now and adopt the plan whatever eq. 4 says (an operator's decision)."""
        await gw.prism.collect()
        try:
            candidate = await gw.prism.replan(force=True)
        except ValueError as exc:
            raise GatewayError(409, str(exc)) from exc
        except PlacementRefused as exc:
            raise GatewayError(502, str(exc), code="upstream_error") from exc
        return _json(candidate)

    @r.post("/prism/freeze")
    async def prism_freeze() -> Response:
        await gw.prism.set_frozen(True)
        return _json(gw.prism.describe())

    @r.post("/prism/unfreeze")
    async def prism_unfreeze() -> Response:
        await gw.prism.set_frozen(False)
        return _json(gw.prism.describe())

    @r.get("/status")
    async def status() -> Response:
        return _json(
            {
                "replica": gw.replica_id,
                "store_up": gw.store.up,
                "replicas": gw.monitor.replicas,
                "snapshot_age_s": round(time.monotonic() - gw.monitor.last_sync, 3),
                "inflight": gw.pool.total_inflight(),
                "arrivals_per_s": gw.arrivals.describe(time.monotonic()),
            }
        )

    return r


class GatewayApp(FastAPI):
    """FastAPI for the API surface, with the proxy routes dispatched straight to the
    proxy: they skip routing, dependency solving and the middleware stack, which cost
    more than the rest of the request path. FastAPI still documents them."""

    @property
    def gateway(self) -> Gateway:
        return self.state.gateway  # type: ignore[no-any-return]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if scope["method"] == "POST":
                endpoint = ENDPOINTS.get(scope["path"])
                if endpoint is not None:
                    await self._proxy(scope, receive, send, endpoint)
                    return
            if scope["path"].startswith("/admin"):
                # Before anything reads the body: a caller without the token learns
                # nothing, not even whether its body would have been valid.
                given = dict(scope["headers"]).get(b"authorization")
                try:
                    require_admin(
                        given.decode("latin-1") if given else None,
                        self.gateway.settings.admin_token,
                    )
                except GatewayError as exc:
                    await exc.response()(scope, receive, send)
                    return
                _bodies_are_json(scope)
        await super().__call__(scope, receive, send)

    async def _proxy(self, scope: Scope, receive: Receive, send: Send, endpoint: Endpoint) -> None:
        watch = ClientWatch()
        try:
            try:
                response = await self.gateway.proxy.handle(Request(scope, receive), endpoint, watch)
            except Exception:  # not CancelledError, a BaseException: that is handled below
                log.exception("unexpected error on the proxy path")
                response = GatewayError(500, "internal gateway error").response()
            await response(scope, receive, send)
        except asyncio.CancelledError:
            if not watch.client_left():
                raise
        finally:
            watch.finish()


# What `curl -d` sends when not told otherwise.
_FORM = b"application/x-www-form-urlencoded"


def _bodies_are_json(scope: Scope) -> None:
    """The admin API takes JSON only, so a body sent without a content type, or with
    curl's default form type, is read as the JSON it must be; anything else that is
    not JSON is refused with a message naming the content type."""
    headers = scope["headers"]
    kind = next((v for k, v in headers if k == b"content-type"), None)
    if kind is None or kind.split(b";")[0].strip().lower() == _FORM:
        others = [(k, v) for k, v in headers if k != b"content-type"]
        scope["headers"] = [*others, (b"content-type", b"application/json")]


# Validation errors of a body that is not JSON, or not an object.
_NOT_A_JSON_OBJECT = frozenset(("json_invalid", "dict_type", "model_attributes_type", "missing"))


def create_app(settings: Settings) -> FastAPI:
    gw = Gateway(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gw.start()
        # Everything alive now lives as long as the process: keep it out of the
        # collector's full passes, which otherwise stall requests now and then.
        gc.collect()
        gc.freeze()
        gc.set_threshold(settings.gc_young_threshold, *gc.get_threshold()[1:])
        yield
        await gw.stop()

    app = GatewayApp(
        title="edgeroute", version="0.1.0", lifespan=lifespan, docs_url="/docs", redoc_url=None
    )
    app.state.gateway = gw

    @app.exception_handler(GatewayError)
    async def _gateway_error(request: Request, exc: GatewayError) -> Response:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        msg = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":
            loc = []  # FastAPI puts the offset where the field would be
        if not loc and first.get("type") in _NOT_A_JSON_OBJECT:
            msg = f"{msg}: the body must be a JSON object, sent as application/json"
        return GatewayError(
            400, f"{'.'.join(loc)}: {msg}" if loc else msg, param=".".join(loc) or None
        ).response()

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> Response:
        return GatewayError(exc.status_code, str(exc.detail)).response()

    # GatewayApp serves these before routing; they are declared for the schema.
    @app.post(CHAT.path, openapi_extra=CHAT.openapi, tags=["openai"])
    async def chat_completions(request: Request) -> Response:
        raise GatewayError(500, "served by GatewayApp")  # pragma: no cover

    @app.post(COMPLETIONS.path, openapi_extra=COMPLETIONS.openapi, tags=["openai"])
    async def completions(request: Request) -> Response:
        raise GatewayError(500, "served by GatewayApp")  # pragma: no cover

    @app.post(EMBEDDINGS.path, openapi_extra=EMBEDDINGS.openapi, tags=["openai"])
    async def embeddings(request: Request) -> Response:
        raise GatewayError(500, "served by GatewayApp")  # pragma: no cover

    def model_card(model: str) -> dict[str, Any]:
        return {"id": model, "object": "model", "created": 0, "owned_by": "edgeroute"}

    @app.get("/v1/models", tags=["openai"])
    async def models(request: Request) -> Response:
        require_client_key(request.headers.get("authorization"), settings.api_keys)
        data = [model_card(m) for m in sorted(gw.pool.models(healthy_only=True))]
        return _json({"object": "list", "data": data})

    @app.get("/v1/models/{model:path}", tags=["openai"])
    async def model(model: str, request: Request) -> Response:
        require_client_key(request.headers.get("authorization"), settings.api_keys)
        if model not in gw.pool.models(healthy_only=True):
            raise GatewayError(
                404, f"The model `{model}` does not exist.", param="model", code="model_not_found"
            )
        return _json(model_card(model))

    # /health is vLLM's name (load generators probe it before a run); /healthz the
    # Kubernetes habit. Both say the process is up, not that a backend is.
    @app.get("/health", tags=["ops"])
    @app.get("/healthz", tags=["ops"])
    async def healthz() -> Response:
        return _json({"status": "ok"})

    @app.get("/readyz", tags=["ops"])
    async def readyz() -> Response:
        healthy = sum(1 for b in gw.pool.view.backends if b.healthy)
        if not gw.started or healthy == 0:
            return _json({"status": "not ready", "healthy_backends": healthy}, 503)
        return _json({"status": "ready", "healthy_backends": healthy})

    @app.get("/metrics", tags=["ops"], response_class=PlainTextResponse)
    async def metrics() -> Response:
        return Response(gw.metrics.render(), media_type="text/plain; version=0.0.4")

    app.include_router(_admin_router(gw))
    app.include_router(
        oracle_router(gw.store, gw.pool, gw.transfers, lambda: gw.oracle, gw.set_oracle)
    )
    return app
