"""Background work that keeps the in-process snapshot fresh.

- scrape: each backend's `/metrics` (vLLM's current and older names, SGLang's and
  llama.cpp's) and, when its models are not configured, `/v1/models`;
- health: `/health` probes, which can open a circuit but never close one (a real
  request does: see `gateway.circuit`); and stalls: a backend that holds requests
  but has sent no byte and generated no token for `timeouts.stall` seconds has
  them aborted (the proxy sends them elsewhere) and its circuit opened;
- sync: in-flight counts and arrival rates with the other replicas, and shared config
  changes.

None of this runs on the request path. Each loop survives any single failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

import httpx

from gateway.arrivals import ArrivalCounts
from gateway.backends import Backend, BackendPool
from gateway.circuit import State
from gateway.metrics import GatewayMetrics
from gateway.promtext import read_labels, read_samples
from gateway.settings import Settings
from gateway.store import SharedStore, StoreUnavailable
from gateway.transfers import KVTransfers
from oracle.state import OracleState

log = logging.getLogger("edgeroute.monitor")

# Each engine's names for the same gauges: vLLM's (current, then older), SGLang's,
# llama.cpp's (llama-server --metrics). The first one a backend exports is read.
RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs", "llamacpp:requests_processing")
WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred")
KV_USAGE = (
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "sglang:token_usage",
    "llamacpp:kv_cache_usage_ratio",
)
GENERATED = (
    "vllm:generation_tokens_total",
    "sglang:generation_tokens_total",
    "llamacpp:tokens_predicted_total",
)
WANTED = frozenset(RUNNING + WAITING + KV_USAGE + GENERATED)
CACHE_INFO = "vllm:cache_config_info"


def _first(samples: dict[str, float], names: tuple[str, ...]) -> float | None:
    for n in names:
        if n in samples:
            return samples[n]
    return None


class SharedConfig(Protocol):
    """The replica's side of the configuration kept in the shared store."""

    oracle: OracleState | None

    async def push_local_config(self) -> None: ...

    async def reload_config(self) -> None: ...


class Monitor:
    """`client` gives the control plane's HTTP client (made when the gateway starts)."""

    def __init__(
        self,
        settings: Settings,
        pool: BackendPool,
        store: SharedStore,
        metrics: GatewayMetrics,
        transfers: KVTransfers,
        config: SharedConfig,
        client: Callable[[], httpx.AsyncClient],
        arrivals: ArrivalCounts,
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.store = store
        self.metrics = metrics
        self.transfers = transfers
        self.config = config
        self.client = client
        self.arrivals = arrivals
        self._tasks: list[asyncio.Task[None]] = []
        self.last_sync = time.monotonic()
        self.config_version = -1
        self.replicas = 1
        self._stopping = False

    def start(self) -> None:
        s = self.settings
        loops: list[tuple[str, Callable[[], Awaitable[None]], float]] = [
            ("scrape", self.scrape_all, s.scrape_interval),
            ("health", self.probe_all, s.health_interval),
            ("sync", self.sync, s.sync_interval),
        ]
        for name, step, every in loops:
            self._tasks.append(asyncio.create_task(self._loop(name, step, every), name=name))

    async def stop(self) -> None:
        self._stopping = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def _loop(self, name: str, step: Callable[[], Awaitable[None]], every: float) -> None:
        me = asyncio.current_task()
        while not self._stopping:
            started = time.monotonic()
            try:
                await step()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s step failed", name)
            # Some client libraries swallow a cancellation that lands inside them;
            # honour it here, or stop() would wait for ever.
            if me is not None and me.cancelling():
                raise asyncio.CancelledError
            await asyncio.sleep(max(0.0, every - (time.monotonic() - started)))

    # -- scrape ---------------------------------------------------------------------

    async def scrape_all(self) -> None:
        backends = list(self.pool)
        await asyncio.gather(*(self._scrape(b) for b in backends))
        self.pool.rebuild()
        self._export()

    async def _scrape(self, b: Backend) -> None:
        client = self.client()
        timeout = self.settings.timeouts.scrape
        try:
            if not b.config.models and (not b.models or b.stats.scraped_at < 0):
                authorization = b.config.authorization()
                headers = {"authorization": authorization} if authorization else {}
                r = await client.get(f"{b.config.url}/v1/models", timeout=timeout, headers=headers)
                if r.status_code == 200:
                    b.models = frozenset(m["id"] for m in r.json().get("data", []))
            r = await client.get(f"{b.config.url}/metrics", timeout=timeout)
            if r.status_code != 200:
                return
            text = r.text
            samples = read_samples(text, WANTED)
            cache = read_labels(text, CACHE_INFO)
        except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
            return  # stats go stale, and stale stats do not steer
        running, waiting = _first(samples, RUNNING), _first(samples, WAITING)
        if running is None and waiting is None:
            return
        b.stats.running = int(running or 0)
        b.stats.waiting = int(waiting or 0)
        b.stats.kv_usage = _first(samples, KV_USAGE) or 0.0
        with contextlib.suppress(KeyError, ValueError):
            b.stats.kv_capacity_tokens = int(cache["num_gpu_blocks"]) * int(cache["block_size"])
        now = time.monotonic()
        generated = _first(samples, GENERATED)
        if generated is not None and generated != b.stats.generated_total:
            if b.stats.generated_total is not None and generated > b.stats.generated_total:
                self.pool.engine_generated(b, generated - b.stats.generated_total)
            b.stats.generated_total = generated
            b.stats.generated_moved_at = now
        b.stats.scraped_at = now

    # -- health -------------------------------------------------------------------------

    async def probe_all(self) -> None:
        await asyncio.gather(*(self._probe(b) for b in list(self.pool)))
        for b in list(self.pool):
            self._check_stall(b, time.monotonic())
        self.pool.rebuild()
        self._export()

    async def _probe(self, b: Backend) -> None:
        now = time.monotonic()
        b.circuit.available(now)  # moves an open circuit past its cool-down to half-open
        try:
            r = await self.client().get(
                f"{b.config.url}/health", timeout=self.settings.timeouts.connect
            )
            ok = r.status_code == 200
        except httpx.HTTPError:
            ok = False
        # A good probe closes nothing: only a request served does (the half-open trial).
        if not ok and b.circuit.state is not State.OPEN and b.circuit.failure(time.monotonic()):
            log.warning("backend %s failed health checks; circuit open", b.id)

    def _check_stall(self, b: Backend, now: float) -> None:
        """Abort the requests waiting on `b` when it has made no progress for `stall`
        seconds while they waited: no byte to us, and no token generated by its engine
        (when it reports that). Without that counter only streams are judged, as a
        long answer that is not streamed sends nothing until it is whole."""
        stall = self.settings.timeouts.stall
        waiting = [a for a in b.pending if now - a.started > stall]
        if not waiting or now - b.progress_at <= stall:
            return
        counted = b.stats.generated_total is not None and now - b.stats.scraped_at <= stall
        if counted and now - b.stats.generated_moved_at <= stall:
            return
        if not counted:
            waiting = [a for a in waiting if a.stream]
            if not waiting:
                return
        for a in waiting:
            a.abort("stalled")
        self.metrics.stalls.labels(b.id).inc()
        if self.pool.stalled(b):
            log.warning(
                "backend %s stalled (%d requests waiting, no progress for %.0f s); circuit open",
                b.id,
                len(waiting),
                stall,
            )

    # -- shared store -------------------------------------------------------------------

    async def sync(self) -> None:
        store = self.store
        await store.revive_embedded()
        local = {b.id: b.inflight for b in self.pool}
        try:
            if self.transfers.intents:
                batch = list(self.transfers.intents)
                await store.add_intents(batch)
                for _ in batch:
                    self.transfers.intents.popleft()
            result = await store.sync(local, self.arrivals.local_rates(time.monotonic()))
        except StoreUnavailable:
            self.metrics.store_up.set(0)
            self.metrics.store_age.set(time.monotonic() - self.last_sync)
            return
        self.last_sync = time.monotonic()
        self.replicas = result.replicas
        self.metrics.store_up.set(1)
        self.metrics.store_age.set(0)
        self.metrics.replicas.set(result.replicas)
        for b in self.pool:
            b.remote_inflight = result.remote_inflight.get(b.id, 0)
        self.arrivals.heard(result.remote_rates)
        if result.config_version == 0:
            # The store has lost its state (restarted without persistence): give it
            # this replica's config back rather than adopt an empty one.
            log.warning("shared store holds no config; re-seeding it from this replica")
            await self.config.push_local_config()
            self.config_version = -1
        elif result.config_version != self.config_version:
            await self.config.reload_config()
            self.config_version = result.config_version
        self.pool.rebuild()

    def _export(self) -> None:
        m = self.metrics
        now = time.monotonic()
        for b in self.pool:
            m.backend_up.labels(b.id).set(1 if (not b.draining and b.circuit.available(now)) else 0)
            m.circuit.labels(b.id).set(int(b.circuit.state))
            m.backend_queue.labels(b.id).set(b.stats.running + b.stats.waiting)
            m.backend_kv.labels(b.id).set(b.stats.kv_usage)
            m.backend_token_latency.labels(b.id).set(b.token_latency)
            m.stats_age.labels(b.id).set(min(now - b.stats.scraped_at, 1e9))
            m.inflight.labels(b.id).set(b.inflight + b.remote_inflight)
        m.local_inflight.set(self.pool.total_inflight())
        oracle = self.config.oracle
        if oracle is not None:
            age = oracle.age()
            if age is not None:
                m.oracle_age.set(age)
            for tier in oracle.topology.tier_bandwidth:
                m.oracle_rho.labels(tier).set(oracle.topology.congestion.get(tier, 0.0))
            for pair, tol in oracle.topology.staleness_tolerances().items():
                m.oracle_tolerance.labels(pair).set(tol)
        for (prefill, tier), n in list(self.transfers.counts.items()):
            m.self_contention.labels(prefill, tier).set(n)
        m.store_age.set(now - self.last_sync)
