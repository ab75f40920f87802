"""The gateway as Prism's global scheduler.

Every `stats_interval` it reads each MoE backend's activation statistics
(`GET /moe/stats`: cumulative counts per request class, per layer and expert); every
`replan_seconds` (default 5 minutes) it plans a placement with Prism over the
activations observed since the last plan, and adopts it only when eq. 4 says so:
C(P') + T_mig(P, P') < C(P), where C is the remote calls per second the placement
would leave (observed rates), times each backend's cost of a remote call, over the
next period. Adopting pushes each changed backend its experts (`PUT
/admin/placement`, applied there with an emulated transfer time). Operators can
read the current map, the last candidate with its expected cost, and the history,
and can force a plan or freeze the map. The expert map and the per-class statistics
feed the `prism` routing policy.

Replicas share the scheduler's state through the store: each publishes the
statistics it read (so a replica cut off from a worker still plans with its numbers),
and the frozen flag, the last candidate and the history live there too. One replica at
a time holds the planner lease and re-plans on the schedule; a forced plan runs on the
replica asked. The map itself is each worker's own `hosted` list, read at every
collection.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import orjson

from gateway.backends import BackendPool
from gateway.metrics import GatewayMetrics
from gateway.store import PRISM, PRISM_PLANNER, SharedStore, StoreUnavailable
from policies.prism import Placement, Server, migration_seconds, prism, remote_cost, should_adopt

log = logging.getLogger("edgeroute.prism")
HISTORY = 100  # adopted plans kept


class PlacementRefused(Exception):
    """Some backends did not take their new experts; the map keeps their old ones."""

    def __init__(self, failures: dict[str, str]) -> None:
        listed = "; ".join(f"{b}: {why}" for b, why in sorted(failures.items()))
        super().__init__(f"the new placement was not applied on every backend ({listed})")
        self.failures = failures


class PrismScheduler:
    """`client` gives the control plane's HTTP client (made when the gateway starts)."""

    def __init__(
        self,
        pool: BackendPool,
        store: SharedStore,
        metrics: GatewayMetrics,
        client: Callable[[], httpx.AsyncClient],
        replan_seconds: float = 300.0,
        stats_interval: float = 5.0,
    ) -> None:
        self.pool = pool
        self.store = store
        self.metrics = metrics
        self.client = client
        self.replan_seconds = replan_seconds
        self.stats_interval = stats_interval
        self.frozen = False
        self.reports: dict[str, dict[str, Any]] = {}  # backend id -> its last /moe/stats
        self.map: dict[str, list[tuple[int, int]]] = {}  # backend id -> hosted experts
        self.candidate: dict[str, Any] | None = None
        self.history: list[dict[str, Any]] = []
        self._task: asyncio.Task[None] | None = None
        # The counts at the start of the current window (the last plan), and when.
        self._window: dict[str, np.ndarray] = {}
        self._window_at = time.monotonic()

    def backends(self) -> list[Any]:
        return [b for b in self.pool if b.config.moe is not None]

    def start(self) -> None:
        if self.backends():
            self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self) -> None:
        last_plan = time.monotonic()
        every = min(self.stats_interval, self.replan_seconds / 2)
        while True:
            try:
                await self.collect()
                planner = await self._is_planner()
                if planner and time.monotonic() - last_plan >= self.replan_seconds:
                    last_plan = time.monotonic()
                    if not self.frozen:
                        await self.replan(force=False)
            except asyncio.CancelledError:
                raise
            except PlacementRefused as exc:
                log.warning("%s", exc)
            except Exception:
                log.exception("prism scheduler step failed")
            await asyncio.sleep(every)

    async def collect(self) -> None:
        fetched: set[str] = set()
        for b in self.backends():
            try:
                r = await self.client().get(b.config.url + "/moe/stats", timeout=2.0)
                if r.status_code == 200:
                    report = r.json()
                    self.reports[b.id] = report
                    fetched.add(b.id)
                    # The worker's own list is the truth (a plan may come from
                    # another replica).
                    self.map[b.id] = [tuple(x) for x in report["hosted"]]
            except (httpx.HTTPError, ValueError, KeyError, TypeError):
                continue
        await self._sync_store(fetched)
        for backend_id, report in self.reports.items():
            if isinstance(report.get("local_ratio"), float | int):
                self.metrics.expert_local.labels(backend_id).set(report["local_ratio"])
        self._feed_policy()

    def _feed_policy(self) -> None:
        """Hand the map and the per-class statistics to the `prism` routing policy."""
        self.pool.set_experts({k: frozenset(v) for k, v in self.map.items()}, self.class_stats())

    async def _is_planner(self) -> bool:
        try:
            return await self.store.lease(PRISM_PLANNER, 3 * self.stats_interval)
        except StoreUnavailable:
            return False  # without the store, no replica re-plans on its own

    async def _publish(self, fields: dict[str, Any]) -> None:
        try:
            await self.store.write_fields(
                PRISM, {k: orjson.dumps(v).decode() for k, v in fields.items()}
            )
        except StoreUnavailable:
            log.warning("prism state not shared: the store is unreachable")

    async def _sync_store(self, fetched: set[str]) -> None:
        """Publish the reports just read; take the rest of the state from the store."""
        fresh = {f"stats:{k}": self.reports[k] for k in fetched}
        await self._publish(fresh)
        try:
            shared = await self.store.read_fields(PRISM)
        except StoreUnavailable:
            return
        ids = {b.id for b in self.backends()}
        for field, raw in shared.items():
            value = orjson.loads(raw)
            if field.startswith("stats:") and field[6:] in ids and field not in fresh:
                self.reports[field[6:]] = value
            elif field == "frozen":
                self.frozen = bool(value)
            elif field == "candidate":
                self.candidate = value
            elif field == "history":
                self.history = value

    async def set_frozen(self, frozen: bool) -> None:
        self.frozen = frozen
        await self._publish({"frozen": frozen})

    def class_stats(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for report in self.reports.values():
            for cls, counts in report.get("classes", {}).items():
                arr = np.asarray(counts, dtype=float)
                out[cls] = out[cls] + arr if cls in out else arr
        return out

    def _totals(self, backend_id: str, layers: int, experts: int) -> np.ndarray:
        total = np.zeros((layers, experts))
        for counts in self.reports[backend_id].get("classes", {}).values():
            total += np.asarray(counts, dtype=float)
        return total

    def _problem(self) -> tuple[list[Any], list[Server], list[np.ndarray], int, float]:
        """The backends, their servers, and each one's activations in this window."""
        backends = [b for b in self.backends() if b.id in self.reports]
        if not backends:
            raise ValueError("no MoE backend has reported statistics yet")
        layers = int(self.reports[backends[0].id]["layers"])
        experts = int(self.reports[backends[0].id]["experts"])
        size = backends[0].config.moe.expert_gb
        servers = [
            Server(b.id, tuple(b.config.moe.gpu_memory_gb), tuple(b.config.moe.io_gbps))
            for b in backends
        ]
        freq = []
        for b in backends:
            now = self._totals(b.id, layers, experts)
            before = self._window.get(b.id)
            seen = now - before if before is not None and before.shape == now.shape else now
            if (seen < 0).any():  # the worker restarted: its counts began again
                seen = now
            freq.append(seen + 1e-6)
        return backends, servers, freq, experts, size

    @staticmethod
    def _placement(
        servers: list[Server], per_server: list[list[tuple[int, int]]], size: float
    ) -> Placement:
        gpus = []
        for s, hosted in zip(servers, per_server, strict=True):
            per_gpu = [int(m // size) for m in s.gpu_memory]
            bins: list[set[tuple[int, int]]] = [set() for _ in per_gpu]
            g = 0
            for e in sorted(hosted):
                while g < len(per_gpu) - 1 and len(bins[g]) >= per_gpu[g]:
                    g += 1
                bins[g].add(e)
            gpus.append(tuple(frozenset(x) for x in bins))
        return Placement(tuple(gpus))

    async def replan(self, force: bool) -> dict[str, Any]:
        backends, servers, freq, experts, size = self._problem()
        elapsed = max(1e-3, time.monotonic() - self._window_at)
        new = prism(servers, experts, size, freq)
        old = self._placement(servers, [self.map.get(b.id, []) for b in backends], size)
        # Eq. 4 in seconds: remote calls per second under each placement (the observed
        # rates), times each backend's cost of one, over the next period.
        per_call = [b.config.moe.remote_call_s for b in backends]
        horizon = self.replan_seconds / elapsed
        cost_old = remote_cost(old, freq, per_call) * horizon
        cost_new = remote_cost(new, freq, per_call) * horizon
        mig = migration_seconds(old, new, servers, size)
        better = should_adopt(cost_new, mig, cost_old)
        adopt = force or better
        calls = sum(float(f.sum()) for f in freq) / elapsed
        if better:
            reason = "C(P') + T_mig < C(P): the new placement pays for its migration"
        elif cost_new >= cost_old:
            reason = "kept: the new placement would not make fewer remote calls"
        else:
            reason = "kept: the migration costs more than the remote calls it saves"
        if force and not better:
            reason = "forced by an operator; " + reason
        self.candidate = {
            "expected_cost_s": float(cost_new),
            "current_cost_s": float(cost_old),
            "migration_s": float(mig),
            "calls_per_s": calls,
            "horizon_s": self.replan_seconds,
            "window_s": elapsed,
            "adopted": bool(adopt),
            "forced": force,
            "reason": reason,
            "at": time.time(),
        }
        # The next window starts now, whatever was decided.
        self._window = {
            b.id: self._totals(b.id, f.shape[0], f.shape[1])
            for b, f in zip(backends, freq, strict=True)
        }
        self._window_at = time.monotonic()
        failures: dict[str, str] = {}
        if adopt:
            changed = [(b, sorted(new.on_server(n))) for n, b in enumerate(backends)]
            changed = [(b, h) for b, h in changed if h != sorted(self.map.get(b.id, []))]
            results = await asyncio.gather(
                *(self._push(b, h) for b, h in changed), return_exceptions=True
            )
            for (b, hosted), result in zip(changed, results, strict=True):
                if isinstance(result, httpx.HTTPError):
                    failures[b.id] = _describe(result)
                elif isinstance(result, BaseException):
                    raise result
                else:
                    self.map[b.id] = hosted  # what the backend now holds
            if failures:
                self.candidate["failed_pushes"] = failures
            self.history = [*self.history, dict(self.candidate)][-HISTORY:]
            self._feed_policy()
            log.info(
                "prism adopted a new placement (expected %.2f s against %.2f s, migration %.1f s)",
                cost_new,
                cost_old,
                mig,
            )
        await self._publish({"candidate": self.candidate, "history": self.history})
        if failures:
            raise PlacementRefused(failures)
        return self.candidate

    async def _push(self, backend: Any, hosted: list[tuple[int, int]]) -> None:
        headers = {"content-type": "application/json"}
        if (token := backend.config.moe.admin_token) is not None:
            headers["authorization"] = f"Bearer {token.get_secret_value()}"
        r = await self.client().put(
            backend.config.url + "/admin/placement",
            content=orjson.dumps({"hosted": hosted}),
            headers=headers,
            timeout=600.0,
        )
        r.raise_for_status()

    def describe(self) -> dict[str, Any]:
        return {
            "frozen": self.frozen,
            "replan_seconds": self.replan_seconds,
            "map": {k: {"experts": len(v)} for k, v in self.map.items()},
            "candidate": self.candidate,
            "history": self.history,
            "local_ratio": {k: r.get("local_ratio") for k, r in self.reports.items()},
        }


def _describe(error: httpx.HTTPError) -> str:
    if isinstance(error, httpx.HTTPStatusError):
        return f"answered {error.response.status_code}"
    return type(error).__name__
